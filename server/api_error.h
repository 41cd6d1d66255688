// Errors the HTTP layer reports to clients in the OpenAI shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": <HTTP status>}}
// `type` follows vLLM (BadRequestError, NotFoundError, ...) and `code` is the HTTP status, as
// vLLM's create_error_response does; the openai clients map the status to their exception class.
#pragma once
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace m3::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {})
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  // The request field at fault ("messages[2].content", "temperature"), empty when none.
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

// The vLLM error type name for an HTTP status ("BadRequestError" for 400, ...).
std::string_view error_type_for_status(int status);
nlohmann::json error_json(int status, std::string_view message, std::string_view param = {});
std::string error_body(int status, std::string_view message, std::string_view param = {});

// 400 naming the field: bad_field("temperature", "must be >= 0, got {}", t).
template <class... Args>
[[noreturn]] void bad_field(std::string_view field, fmt::format_string<Args...> format,
                            Args&&... args) {
  throw ApiError(400,
                 fmt::format("'{}' {}", field, fmt::format(format, std::forward<Args>(args)...)),
                 std::string(field));
}

template <class... Args>
[[noreturn]] void bad_request(fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace m3::server
