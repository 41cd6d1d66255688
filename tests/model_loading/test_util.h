// Test helpers: a safetensors writer (well-formed files and deliberately corrupt ones) and a
// scratch directory removed when the test ends.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "formats/bf16.h"
#include "formats/fp16.h"

namespace m3::testing {

// A fresh directory per test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "scratch";
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = std::filesystem::temp_directory_path() /
            ("m3_loading_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// header length (u64 LE) + header + data, with the length field overridable for corrupt files.
inline std::vector<uint8_t> safetensors_bytes(const std::string& header,
                                              const std::vector<uint8_t>& data,
                                              uint64_t header_len_field = UINT64_MAX) {
  uint64_t len = header_len_field == UINT64_MAX ? header.size() : header_len_field;
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return out;
}

// Collects tensors, then writes one well-formed safetensors file.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, Shape shape, std::vector<uint8_t> bytes) {
    EXPECT_EQ(bytes.size(), static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype))
        << name;
    tensors_[name] = {dtype, std::move(shape), std::move(bytes)};
  }
  template <class T>
  void add_values(const std::string& name, DType dtype, Shape shape, const std::vector<T>& values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(T));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    add(name, dtype, std::move(shape), std::move(bytes));
  }
  void add_f32(const std::string& name, Shape shape, const std::vector<float>& v) {
    add_values(name, DType::kF32, std::move(shape), v);
  }
  // Stores bf16(v); returns the values as stored (decoded back to fp32).
  std::vector<float> add_bf16(const std::string& name, Shape shape, const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    std::vector<float> stored(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      h[i] = bf16_encode(v[i]);
      stored[i] = bf16_decode(h[i]);
    }
    add_values(name, DType::kBF16, std::move(shape), h);
    return stored;
  }
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  bool empty() const { return tensors_.empty(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : tensors_) out.push_back(name);
    return out;
  }
  void remove(const std::string& name) { tensors_.erase(name); }

  // Tensors packed back to back in name order.
  void write(const std::filesystem::path& path) const {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::vector<uint8_t> data;
    for (const auto& [name, t] : tensors_) {
      header[name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
      data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    }
    write_bytes(path, safetensors_bytes(header.dump(), data));
  }

  // Splits the tensors over `num_shards` files plus model.safetensors.index.json in `dir`.
  void write_sharded(const std::filesystem::path& dir, int num_shards) const {
    std::vector<SafetensorsWriter> shards(num_shards);
    nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                            {"weight_map", nlohmann::json::object()}};
    int i = 0;
    for (const auto& [name, t] : tensors_) {
      int s = i++ % num_shards;
      shards[s].tensors_[name] = t;
      index["weight_map"][name] = shard_name(s, num_shards);
    }
    for (int s = 0; s < num_shards; ++s) shards[s].write(dir / shard_name(s, num_shards));
    write_text(dir / "model.safetensors.index.json", index.dump(2));
  }

  static std::string shard_name(int s, int n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, n);
    return buf;
  }

 private:
  struct Entry {
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace m3::testing
