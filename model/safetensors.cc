#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"

namespace m3 {

// A read-only private mapping of a whole file, unmapped when the last Tensor view goes away.
struct MappedFile {
  const uint8_t* bytes = nullptr;
  std::size_t size = 0;

  MappedFile(const std::filesystem::path& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      fail("{}: cannot stat: {}", path.string(), std::strerror(err));
    }
    size = static_cast<std::size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      int err = errno;
      ::close(fd);
      if (p == MAP_FAILED)
        fail("{}: cannot mmap {} bytes: {}", path.string(), size, std::strerror(err));
      bytes = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() {
    if (bytes) ::munmap(const_cast<uint8_t*>(bytes), size);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
};

namespace {

// safetensors spelling -> DType. F8_E8M0 (UE8M0 block scales, newer writers) is read as U8: the
// MXFP8 code handles the bytes as UE8M0 either way.
std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F8_E8M0") return DType::kU8;
  return dtype_from_safetensors(name);
}

uint64_t json_u64(const nlohmann::json& v, const std::string& file, const std::string& tensor,
                  const char* field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  fail("{}: tensor '{}': {} entries must be non-negative integers, got {}", file, tensor, field,
       v.dump());
}

SafetensorsEntry parse_entry(const std::string& file, const std::string& name,
                             const nlohmann::json& info, uint64_t data_bytes) {
  if (!info.is_object()) fail("{}: tensor '{}': header entry is not an object", file, name);
  SafetensorsEntry e;
  e.name = name;

  auto dt = info.find("dtype");
  if (dt == info.end() || !dt->is_string())
    fail("{}: tensor '{}': missing string 'dtype'", file, name);
  auto dtype = parse_dtype(dt->get<std::string>());
  if (!dtype) fail("{}: tensor '{}': unknown dtype '{}'", file, name, dt->get<std::string>());
  e.dtype = *dtype;

  auto sh = info.find("shape");
  if (sh == info.end() || !sh->is_array())
    fail("{}: tensor '{}': missing array 'shape'", file, name);
  // numel * element size must fit: a tensor larger than the file fails the size check below.
  unsigned __int128 bytes = dtype_size(e.dtype);
  for (const auto& d : *sh) {
    uint64_t dim = json_u64(d, file, name, "shape");
    if (dim > (uint64_t{1} << 62)) fail("{}: tensor '{}': dimension {} too large", file, name, dim);
    e.shape.push_back(static_cast<int64_t>(dim));
    bytes *= dim;
    if (bytes > (static_cast<unsigned __int128>(1) << 64))
      bytes = static_cast<unsigned __int128>(1) << 64;
  }

  auto off = info.find("data_offsets");
  if (off == info.end() || !off->is_array() || off->size() != 2)
    fail("{}: tensor '{}': 'data_offsets' must be [begin, end]", file, name);
  e.data_begin = json_u64((*off)[0], file, name, "data_offsets");
  e.data_end = json_u64((*off)[1], file, name, "data_offsets");
  if (e.data_begin > e.data_end)
    fail("{}: tensor '{}': data_offsets [{}, {}] has begin after end", file, name, e.data_begin,
         e.data_end);
  if (e.data_end > data_bytes)
    fail(
        "{}: tensor '{}': data_offsets [{}, {}] run past the data section of {} bytes "
        "(truncated file?)",
        file, name, e.data_begin, e.data_end, data_bytes);
  if (bytes != e.data_end - e.data_begin)
    fail("{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] hold {}", file, name,
         dtype_name(e.dtype), shape_string(e.shape), static_cast<uint64_t>(bytes), e.data_begin,
         e.data_end, e.data_end - e.data_begin);
  return e;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = std::make_shared<const MappedFile>(path);
  const std::string file = path.string();
  const std::size_t size = f.map_->size;
  if (size < 8) fail("{}: truncated: {} bytes, shorter than the 8-byte header length", file, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f.map_->bytes[i];
  if (header_len > size - 8)
    fail(
        "{}: header length {} runs past the end of the {}-byte file (truncated or not a "
        "safetensors file)",
        file, header_len, size);

  nlohmann::json header;
  try {
    const char* begin = reinterpret_cast<const char*>(f.map_->bytes + 8);
    header = nlohmann::json::parse(begin, begin + header_len);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", file);

  f.data_ = f.map_->bytes + 8 + header_len;
  f.data_bytes_ = size - 8 - header_len;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) fail("{}: __metadata__ is not an object", file);
      for (const auto& [k, v] : info.items())
        f.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    f.entries_.push_back(parse_entry(file, name, info, f.data_bytes_));
  }

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : f.entries_)
    if (e.data_end > e.data_begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    if (cur->data_begin < prev->data_end)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, prev->name,
           prev->data_begin, prev->data_end, cur->name, cur->data_begin, cur->data_end);
  }
  for (std::size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) fail("{}: no tensor '{}'", path_.string(), name);
  return tensor(*e);
}

Tensor SafetensorsFile::tensor(const SafetensorsEntry& entry) const {
  // Read-only memory behind a mutable pointer: Tensor has no const view; writers would fault.
  void* p = const_cast<uint8_t*>(data_ + entry.data_begin);
  return Tensor::wrap(p, entry.shape, entry.dtype, Device::kCpu,
                      std::const_pointer_cast<MappedFile>(map_));
}

// ---- checkpoint ----

void SafetensorsCheckpoint::add_file(SafetensorsFile file) {
  std::size_t fi = files_.size();
  for (std::size_t ei = 0; ei < file.entries().size(); ++ei) {
    const std::string& name = file.entries()[ei].name;
    auto [it, inserted] = where_.try_emplace(name, fi, ei);
    if (!inserted)
      fail("tensor '{}' is in both {} and {}", name, files_[it->second.first].path().string(),
           file.path().string());
  }
  files_.push_back(std::move(file));
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ckpt;
  std::error_code ec;
  fs::path index_path;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "model.safetensors.index.json")) {
      index_path = path / "model.safetensors.index.json";
    } else {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(path))
        if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
          files.push_back(entry.path());
      if (files.empty())
        fail("{}: no model.safetensors.index.json and no *.safetensors files", path.string());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) ckpt.add_file(SafetensorsFile::open(f));
      return ckpt;
    }
  } else if (path.extension() == ".json") {
    index_path = path;
  } else {
    ckpt.add_file(SafetensorsFile::open(path));
    return ckpt;
  }

  // Sharded: the index names each tensor's file.
  const std::string index_name = index_path.string();
  nlohmann::json index;
  {
    std::ifstream in(index_path);
    if (!in) fail("{}: cannot open", index_name);
    try {
      index = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", index_name, e.what());
    }
  }
  auto wm = index.is_object() ? index.find("weight_map") : index.end();
  if (wm == index.end() || !wm->is_object()) fail("{}: missing object 'weight_map'", index_name);
  std::map<std::string, std::vector<std::string>> tensors_by_file;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) fail("{}: weight_map['{}'] is not a file name", index_name, name);
    std::string f = file.get<std::string>();
    if (f.empty() || fs::path(f).is_absolute() || f.find("..") != std::string::npos)
      fail("{}: weight_map['{}'] = '{}' is not a file inside the checkpoint directory", index_name,
           name, f);
    tensors_by_file[f].push_back(name);
  }
  const fs::path dir = index_path.parent_path();
  for (const auto& [file, names] : tensors_by_file) {
    SafetensorsFile shard = SafetensorsFile::open(dir / file);
    for (const auto& name : names)
      if (!shard.find(name))
        fail("{}: tensor '{}' is listed in {} but missing from that shard", shard.path().string(),
             name, index_path.filename().string());
    if (shard.entries().size() != names.size())
      M3_LOG_WARN("{}: holds {} tensors, the index lists {} of them; loading all",
                  shard.path().string(), shard.entries().size(), names.size());
    ckpt.add_file(std::move(shard));
  }
  return ckpt;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
  return where_.find(name) != where_.end();
}

const SafetensorsEntry* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  return &files_[it->second.first].entries()[it->second.second];
}

Tensor SafetensorsCheckpoint::tensor(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("checkpoint has no tensor '{}'", name);
  const SafetensorsFile& f = files_[it->second.first];
  return f.tensor(f.entries()[it->second.second]);
}

std::string SafetensorsCheckpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : files_[it->second.first].path().string();
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, loc] : where_) out.push_back(name);
  return out;
}

}  // namespace m3
