// One small logger: levels, a timestamp, stderr. The level is set once at start-up.
#pragma once
#include <fmt/core.h>
#include <string_view>

namespace m3 {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses "debug", "info", "warn", "error", "off"; throws m3::Error otherwise.
LogLevel parse_log_level(std::string_view name);
void log_message(LogLevel level, std::string_view message);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace m3

#define M3_LOG_DEBUG(...) ::m3::log(::m3::LogLevel::kDebug, __VA_ARGS__)
#define M3_LOG_INFO(...) ::m3::log(::m3::LogLevel::kInfo, __VA_ARGS__)
#define M3_LOG_WARN(...) ::m3::log(::m3::LogLevel::kWarn, __VA_ARGS__)
#define M3_LOG_ERROR(...) ::m3::log(::m3::LogLevel::kError, __VA_ARGS__)
