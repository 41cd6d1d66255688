// A minimal blocking HTTP/1.1 client over a loopback socket, for server tests that need what
// client libraries hide: raw SSE bytes, partial reads, dropping a connection mid-stream, and
// malformed requests.
#pragma once
#include <map>
#include <string>
#include <string_view>

namespace m3::testing {

struct HttpReply {
  int status = 0;                              // 0: no response (connection closed or failed)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

// Sends `raw` (a complete request) and reads the response to the end of the connection.
HttpReply send_raw(int port, std::string_view raw, int timeout_ms = 30000);

// A well-formed request; "Connection: close" is added so the reply ends with the connection.
HttpReply http_request(int port, std::string_view method, std::string_view path,
                       std::string_view body = {},
                       const std::map<std::string, std::string>& headers = {},
                       int timeout_ms = 30000);
inline HttpReply http_post(int port, std::string_view path, std::string_view body,
                           const std::map<std::string, std::string>& headers = {}) {
  return http_request(port, "POST", path, body, headers);
}
inline HttpReply http_get(int port, std::string_view path) {
  return http_request(port, "GET", path);
}

// An open connection that has sent a request, for reading part of a response and hanging up.
class OpenRequest {
 public:
  OpenRequest(int port, std::string_view method, std::string_view path, std::string_view body);
  ~OpenRequest();
  OpenRequest(const OpenRequest&) = delete;
  OpenRequest& operator=(const OpenRequest&) = delete;
  // Reads until `needle` has appeared in the raw bytes received (or timeout); returns them.
  std::string read_until(std::string_view needle, int timeout_ms = 30000);
  void close();

 private:
  int fd_ = -1;
  std::string received_;
};

}  // namespace m3::testing
