#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "core/error.h"

namespace m3 {
namespace {
// The one process-wide setting: chosen by the command line before any thread starts.
std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_write_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  fail("unknown log level '{}' (expected debug, info, warn, error or off)", name);
}

void log_message(LogLevel level, std::string_view message) {
  static constexpr const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  std::lock_guard lock(g_write_mutex);
  std::fprintf(stderr, "%s %-5s %.*s\n", stamp, kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace m3
