#include "server/background_tasks.h"

#include <exception>

#include "core/log.h"

namespace m3::server {

BackgroundTasks::~BackgroundTasks() { stop(); }

void BackgroundTasks::post(std::function<void()> task) {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  queue_.push_back(std::move(task));
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_one();
}

void BackgroundTasks::stop() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    dropped.swap(queue_);
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // `dropped` destroys its tasks here, outside the lock (they may own the last reference to a
  // response, whose destructor takes other locks).
}

void BackgroundTasks::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
      if (stopped_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      M3_LOG_ERROR("background response task: {}", e.what());
    }
  }
}

void DetachedWriter::post(std::function<void()> task) {
  if (ended_) return;
  tasks_.post([self = shared_from_this(), task = std::move(task)] {
    if (!self->ended_) task();
  });
}

void DetachedWriter::close() {
  tasks_.post([self = shared_from_this()] {
    if (self->ended_.exchange(true)) return;
    if (auto callback = std::move(self->on_close_)) callback();
  });
}

}  // namespace m3::server
