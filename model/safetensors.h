// safetensors checkpoints: one file, a directory of files, or shards listed by
// model.safetensors.index.json. Files are memory-mapped read-only; tensors are zero-copy views
// whose Tensor keeps the mapping alive (never write through them).
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {...}}, then the data section; offsets are relative
// to the start of the data section. Every entry is validated on open (known dtype, non-negative
// shape, offsets inside the data section, size == numel * dtype size, no two tensors overlapping),
// so a corrupt file is an m3::Error naming the file and tensor, never a crash.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace m3 {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t data_begin = 0;  // relative to the data section
  uint64_t data_end = 0;
};

struct MappedFile;  // RAII read-only mapping (safetensors.cc)

// One mapped .safetensors file. Copies share the mapping.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(std::string_view name) const;
  // Zero-copy view; throws naming the file when the tensor is absent.
  Tensor tensor(std::string_view name) const;
  Tensor tensor(const SafetensorsEntry& entry) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<const MappedFile> map_;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint, whichever files hold them.
class SafetensorsCheckpoint {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a directory: the index when
  // present, otherwise every *.safetensors file in it. A tensor in two files is an error.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);

  bool contains(std::string_view name) const;
  const SafetensorsEntry* find(std::string_view name) const;
  // Zero-copy view; throws naming the tensor when absent.
  Tensor tensor(std::string_view name) const;
  // The file holding `name` (for error messages); empty when absent.
  std::string file_of(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  std::size_t size() const { return where_.size(); }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  void add_file(SafetensorsFile file);

  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where_;  // file, entry
};

}  // namespace m3
