// Plain HTTP/1.1 to an OpenAI-compatible server: one request per connection, the response body
// handed over in pieces as it arrives (an SSE stream is read as it is written). Plain types only:
// this is the one file of loadgen/ that sees Boost.Beast/Asio.
#pragma once
#include <chrono>
#include <functional>
#include <string>

namespace m3::loadgen {

// http://host:port, parsed once.
struct Endpoint {
  std::string host;
  std::string port;
  // Throws m3::Error naming the text when it is not http://host[:port][/]. https is not supported.
  static Endpoint parse(const std::string& base_url);
};

struct HttpResult {
  int status = 0;        // 0: the transfer failed (see error)
  std::string error;     // why the transfer failed, or the start of a non-2xx body
};

// POST (body non-empty) or GET (body empty) `target`; every piece of a 2xx body goes to on_body.
// Never throws for network trouble: the result says what happened. `timeout` bounds each step
// (connect, a read) rather than the whole exchange, so a long stream is fine.
HttpResult http_request(const Endpoint& endpoint, const std::string& target, const std::string& body,
                        const std::string& bearer_token, std::chrono::seconds timeout,
                        const std::function<void(const char*, size_t)>& on_body);

}  // namespace m3::loadgen
