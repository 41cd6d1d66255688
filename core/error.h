// The project's exception: thrown at load time and at API boundaries with enough context
// (file, tensor, field, request) for a user to act on. Inner loops and kernels never throw.
#pragma once
#include <fmt/core.h>
#include <stdexcept>
#include <string>
#include <utility>

namespace m3 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace m3

// Throws m3::Error with a formatted message when the condition is false.
#define M3_CHECK(cond, ...)        \
  do {                             \
    if (!(cond)) {                 \
      ::m3::fail(__VA_ARGS__);     \
    }                              \
  } while (0)
