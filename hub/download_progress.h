// A progress bar for a download on a terminal (bytes, rate, files); nothing when stderr is not one.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace m3::hub {

class DownloadProgress {
 public:
  DownloadProgress(bool enabled, std::string what, int64_t total_bytes, int files);
  ~DownloadProgress();

  void add_bytes(int64_t bytes);
  // A resumed partial counts as done, but not toward the rate.
  void add_resumed(int64_t bytes);
  void file_done();

 private:
  void draw(bool force);

  bool enabled_;
  std::string what_;
  int64_t total_bytes_;
  int files_;
  int64_t done_bytes_ = 0;
  int64_t fetched_bytes_ = 0;
  int files_done_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace m3::hub
