// A small HTTP/1.1 client for the Hugging Face Hub: one GET at a time over http or https, the
// redirects followed, the body streamed to a callback. Plain types only: hub/http_client.cc is the
// one file of hub/ that sees Boost.Beast/Asio and OpenSSL's TLS. HTTPS verifies the server's
// certificate against the system store (OpenSSL's default paths; SSL_CERT_FILE / SSL_CERT_DIR
// override them) and its host name.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace m3::hub {

// The transfer itself failed (name resolution, connect, TLS, a connection that broke or went
// silent): worth another attempt, unlike an HTTP error status. The message names the URL.
class NetworkError : public Error {
 public:
  using Error::Error;
};

struct HttpHeader {
  std::string name;
  std::string value;
};

// scheme://host[:port]/target, scheme http or https.
struct Url {
  std::string scheme;
  std::string host;
  std::string port;    // "80" / "443" when the URL gives none
  std::string target;  // path and query, "/" at least

  // Throws m3::Error naming the text when it is not an http(s) URL.
  static Url parse(const std::string& text);
  // A redirect's Location against this URL: absolute, or relative to its host.
  Url resolve(const std::string& location) const;
  std::string str() const;
};

struct HttpResponse {
  int status = 0;
  std::vector<HttpHeader> headers;  // of the last response (after redirects)
  std::string url;                  // the URL that answered
  std::string error_body;           // the start of a non-2xx body (for its message)

  // The header's value (names compare case-insensitively), or nullopt.
  std::optional<std::string> header(const std::string& name) const;
};

struct HttpGetOptions {
  std::vector<HttpHeader> headers;
  // Headers sent only to the first URL's host (Authorization: a redirect to a CDN gets none).
  std::vector<HttpHeader> same_host_headers;
  int max_redirects = 10;
  // Longest wait for one step (connect, TLS handshake, a piece of the response) before the
  // transfer counts as broken.
  std::chrono::seconds timeout{60};
};

class HttpClient {
 public:
  // Called once per response, before its body, with the status and headers (not for redirects).
  using HeadCallback = std::function<void(const HttpResponse&)>;
  // The body of a 2xx response, in pieces as they arrive.
  using BodyCallback = std::function<void(const char* data, std::size_t size)>;

  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET url. Throws NetworkError when the transfer fails (bytes already given to on_body stay
  // given); an HTTP error status is returned, not thrown.
  HttpResponse get(const std::string& url, const HttpGetOptions& options, const HeadCallback& on_head,
                   const BodyCallback& on_body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3::hub
