#include "hub/blob_download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "core/log.h"
#include "hub/sha256.h"

namespace m3::hub {
namespace {

namespace fs = std::filesystem;

// flock(2) on huggingface_hub's lock file (its filelock takes the same lock).
class BlobLock {
 public:
  explicit BlobLock(const fs::path& path) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    M3_CHECK(!ec, "Hugging Face cache: cannot create {} ({})", path.parent_path().string(), ec.message());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    M3_CHECK(fd_ >= 0, "Hugging Face cache: cannot open the lock file {} ({})", path.string(), std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd_);
      fail("Hugging Face cache: cannot lock {} ({})", path.string(), std::strerror(error));
    }
  }
  ~BlobLock() { ::close(fd_); }  // closing releases the lock
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

bool usable_blob_name(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Feeds a file's bytes to the hasher (the part of a partial file kept from an earlier attempt).
void hash_file(Sha256& hasher, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in, "cannot read {}", path.string());
  std::vector<char> piece(1 << 20);
  while (in) {
    in.read(piece.data(), static_cast<std::streamsize>(piece.size()));
    if (in.gcount() > 0) hasher.update(piece.data(), static_cast<std::size_t>(in.gcount()));
  }
}

// One attempt: asks for the bytes after the partial file's and appends them (or, when the
// server ignores the Range, starts the file over). Throws NetworkError when the transfer breaks.
void fetch_rest(const BlobDownload& d, const RepoFile& file, const std::string& url, const fs::path& partial,
                std::optional<Sha256>& hasher) {
  const int64_t have = fs::exists(partial) ? static_cast<int64_t>(fs::file_size(partial)) : 0;
  HttpGetOptions options = hub_get_options(d.request.settings);
  if (have > 0) options.headers.push_back({"Range", fmt::format("bytes={}-", have)});
  std::ofstream out;
  const auto on_head = [&](const HttpResponse& response) {
    if (response.status == 206) {
      const std::string range = response.header("Content-Range").value_or("");
      if (range.rfind(fmt::format("bytes {}-", have), 0) != 0) {
        throw NetworkError(fmt::format("{}: asked for the bytes from {}, the answer holds '{}'", response.url, have,
                                       range));
      }
      if (file.lfs_sha256) {
        hasher.emplace();
        hash_file(*hasher, partial);
      }
      out.open(partial, std::ios::binary | std::ios::app);
    } else if (response.status == 200) {
      if (file.lfs_sha256) hasher.emplace();
      d.progress.add_resumed(-have);
      out.open(partial, std::ios::binary | std::ios::trunc);
    } else {
      return;  // an error status: nothing is written
    }
    M3_CHECK(out.is_open(), "cannot write {}", partial.string());
  };
  const auto on_body = [&](const char* data, std::size_t size) {
    out.write(data, static_cast<std::streamsize>(size));
    M3_CHECK(out.good(), "writing {} failed (disk full?)", partial.string());
    if (hasher) hasher->update(data, size);
    d.progress.add_bytes(static_cast<int64_t>(size));
  };
  const HttpResponse response = d.client.get(url, options, on_head, on_body);
  out.close();
  M3_CHECK(!out.fail(), "writing {} failed (disk full?)", partial.string());
  if (response.status == 416) {
    // The server holds fewer bytes than the partial file: it is not a prefix of this file.
    fs::remove(partial);
    throw NetworkError(fmt::format("{}: the server refused the range from byte {} (HTTP 416); starting over", url,
                                   have));
  }
  if (response.status >= 500) {
    throw NetworkError(fmt::format("{}: HTTP {} (the server's side failed)", response.url, response.status));
  }
  check_status(response, d.request, fmt::format("file '{}'", file.path));
}

}  // namespace

void download_blob(const BlobDownload& d, const RepoFile& file) {
  const std::string url = file_url(d.request, file.path);
  const std::string& name = file.blob_name();
  M3_CHECK(usable_blob_name(name), "{}: the Hub's listing gives file '{}' no usable blob id or sha256 ('{}')", url,
           file.path, name);
  const fs::path blob = d.cache.blob(name);
  std::error_code ec;
  fs::create_directories(blob.parent_path(), ec);
  M3_CHECK(!ec, "Hugging Face cache: cannot create {} ({})", blob.parent_path().string(), ec.message());
  const BlobLock lock(d.cache.lock_file(name));
  if (fs::exists(blob) && static_cast<int64_t>(fs::file_size(blob)) == file.size) return;  // another process's

  const fs::path partial = blob.string() + ".incomplete";
  if (fs::exists(partial)) {
    const int64_t have = static_cast<int64_t>(fs::file_size(partial));
    if (have > file.size) {
      fs::remove(partial);  // longer than the file: not a partial of it
    } else if (have > 0) {
      M3_LOG_INFO("{}: resuming from byte {} of {} ({})", file.path, have, file.size, partial.string());
      d.progress.add_resumed(have);
    }
  }
  // Set by each transfer (from the partial file's bytes when it resumes); hashed here when the
  // partial file was already whole.
  std::optional<Sha256> hasher;
  for (int attempt = 1;; ++attempt) {
    try {
      if (!fs::exists(partial) || static_cast<int64_t>(fs::file_size(partial)) < file.size) {
        fetch_rest(d, file, url, partial, hasher);
      }
      break;
    } catch (const NetworkError& e) {
      const int64_t kept = fs::exists(partial) ? static_cast<int64_t>(fs::file_size(partial)) : 0;
      if (attempt >= d.attempts) {
        fail("downloading '{}' of {} failed after {} attempts: {}; the {} bytes received are kept in {} and the next "
             "run resumes from there",
             file.path, d.request.repo.str(), attempt, e.what(), kept, partial.string());
      }
      M3_LOG_WARN("{}; resuming from byte {} (attempt {} of {})", e.what(), kept, attempt + 1, d.attempts);
      std::this_thread::sleep_for(std::chrono::milliseconds(500 * attempt));
    }
  }

  const int64_t size = fs::exists(partial) ? static_cast<int64_t>(fs::file_size(partial)) : 0;
  if (size != file.size) {
    fs::remove(partial);
    fail("'{}' of {}: received {} bytes, the Hub lists {} ({}); the partial file was removed, run again to download "
         "it afresh",
         file.path, d.request.repo.str(), size, file.size, url);
  }
  if (file.lfs_sha256) {
    if (!hasher) {
      hasher.emplace();
      hash_file(*hasher, partial);
    }
    const std::string digest = hasher->hex_digest();
    if (digest != *file.lfs_sha256) {
      fs::remove(partial);
      fail("'{}' of {}: sha256 mismatch (got {}, the Hub lists {}; {}); the bad download was removed, run again to "
           "download it afresh",
           file.path, d.request.repo.str(), digest, *file.lfs_sha256, url);
    }
  }
  fs::rename(partial, blob, ec);
  M3_CHECK(!ec, "Hugging Face cache: cannot move {} to {} ({})", partial.string(), blob.string(), ec.message());
  d.progress.file_done();
}

}  // namespace m3::hub
