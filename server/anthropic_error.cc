#include "server/anthropic_error.h"

#include <fmt/format.h>

namespace m3::server {

std::string_view anthropic_error_type(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    case 504:
      return "timeout_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::json anthropic_error_json(int status, std::string_view message, std::string_view param) {
  std::string text(message);
  if (!param.empty() && text.find(param) == std::string::npos) {
    text = fmt::format("{}: {}", param, text);
  }
  return {{"type", "error"},
          {"error", {{"type", anthropic_error_type(status)}, {"message", std::move(text)}}}};
}

std::string anthropic_error_body(int status, std::string_view message, std::string_view param) {
  return anthropic_error_json(status, message, param)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace m3::server
