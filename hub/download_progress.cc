#include "hub/download_progress.h"

#include <algorithm>
#include <cstdio>

namespace m3::hub {

DownloadProgress::DownloadProgress(bool enabled, std::string what, int64_t total_bytes, int files)
    : enabled_(enabled), what_(std::move(what)), total_bytes_(total_bytes), files_(files),
      start_(std::chrono::steady_clock::now()) {}

DownloadProgress::~DownloadProgress() {
  if (enabled_ && files_ > 0) {
    draw(true);
    std::fputc('\n', stderr);
  }
}

void DownloadProgress::add_bytes(int64_t bytes) {
  done_bytes_ += bytes;
  fetched_bytes_ += bytes;
  draw(false);
}

void DownloadProgress::add_resumed(int64_t bytes) {
  done_bytes_ += bytes;
  draw(true);
}

void DownloadProgress::file_done() {
  ++files_done_;
  draw(true);
}

void DownloadProgress::draw(bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // A few redraws a second are enough; a 64 KiB piece arrives far more often.
  if (!force && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double fraction = total_bytes_ > 0 ? std::min(1.0, static_cast<double>(done_bytes_) / total_bytes_) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * fraction);
  const double rate = seconds > 0 ? fetched_bytes_ / seconds / (1024.0 * 1024.0) : 0.0;
  std::fprintf(stderr, "\rdownloading %s [%s%s] %3d%% %.1f/%.1f MiB %.1f MiB/s %d/%d files", what_.c_str(),
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
               static_cast<int>(100 * fraction), done_bytes_ / (1024.0 * 1024.0), total_bytes_ / (1024.0 * 1024.0),
               rate, files_done_, files_);
  std::fflush(stderr);
}

}  // namespace m3::hub
