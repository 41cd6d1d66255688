// The Responses API's background responses (background: true) run without a client connection.
// BackgroundTasks is the thread their work runs on: the tasks posted run one at a time in order,
// as a connection's thread runs a foreground response's. DetachedWriter is the StreamWriter such
// a response writes to: it posts there, keeps no bytes, and close() ends it as a client that hangs
// up would (the cancel of a background response).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "server/http_server.h"

namespace m3::server {

class BackgroundTasks {
 public:
  BackgroundTasks() = default;
  ~BackgroundTasks();  // stop()
  BackgroundTasks(const BackgroundTasks&) = delete;
  BackgroundTasks& operator=(const BackgroundTasks&) = delete;

  // Safe from any thread; the thread starts with the first task. Dropped after stop().
  void post(std::function<void()> task);
  // Runs nothing more (the tasks queued are dropped) and joins the thread.
  void stop();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopped_ = false;
  std::thread thread_;
};

class DetachedWriter final : public StreamWriter, public std::enable_shared_from_this<DetachedWriter> {
 public:
  explicit DetachedWriter(BackgroundTasks& tasks) : tasks_(tasks) {}

  void post(std::function<void()> task) override;
  bool write(std::string, Clock::time_point = {}) override { return !ended_; }
  // Also lets go of the on_close callback, which holds the response.
  void finish() override {
    ended_ = true;
    on_close_ = nullptr;
  }
  bool writable() const override { return true; }
  void on_writable(std::function<void()> callback) override { post(std::move(callback)); }
  void on_close(std::function<void()> callback) override { on_close_ = std::move(callback); }
  // From any thread: on the tasks' thread, unless it ended first, runs the on_close callback.
  void close();

 private:
  BackgroundTasks& tasks_;
  std::atomic<bool> ended_{false};
  std::function<void()> on_close_;  // the tasks' thread only
};

}  // namespace m3::server
