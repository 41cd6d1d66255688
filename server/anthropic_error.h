// Errors of the Anthropic Messages routes (/v1/messages, /v1/messages/count_tokens) in
// Anthropic's shape:
//   {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
// with the HTTP status Anthropic uses for each type, so Anthropic's clients raise the matching
// exception and show the message. The OpenAI routes keep the OpenAI shape (server/api_error.h).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace m3::server {

// Anthropic's error type for an HTTP status: 400 invalid_request_error, 401 authentication_error,
// 403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 and
// 529 overloaded_error (503 is what m3serve answers while loading or draining), 504
// timeout_error, any other 5xx api_error, any other 4xx invalid_request_error.
std::string_view anthropic_error_type(int status);
// The error object. `param` (the field at fault) is already named in m3serve's messages; it is
// appended only when the message does not mention it.
nlohmann::json anthropic_error_json(int status, std::string_view message, std::string_view param = {});
// The same, as a response body (invalid UTF-8 in a quoted input becomes U+FFFD).
std::string anthropic_error_body(int status, std::string_view message, std::string_view param = {});

}  // namespace m3::server
