#include "server/api_error.h"

namespace m3::server {

std::string_view error_type_for_status(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 408:
      return "RequestTimeoutError";
    case 413:
      return "RequestEntityTooLargeError";
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 431:
      return "RequestHeaderFieldsTooLargeError";
    case 501:
      return "NotImplementedError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

nlohmann::json error_json(int status, std::string_view message, std::string_view param) {
  nlohmann::json param_json = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  return {{"error",
           {{"message", message},
            {"type", error_type_for_status(status)},
            {"param", std::move(param_json)},
            {"code", status}}}};
}

std::string error_body(int status, std::string_view message, std::string_view param) {
  // Messages may quote client input; never let a stray byte turn an error into a crash.
  return error_json(status, message, param)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace m3::server
