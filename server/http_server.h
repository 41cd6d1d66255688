// HTTP plumbing over cpp-httplib: limits (body, headers, concurrent connections, timeouts), API-key
// auth, OpenAI-shaped errors for everything that goes wrong (including errors the library itself
// produces: malformed requests, 404, 413), and a background listener thread.
//
// Route handlers may throw ApiError (status + message), m3::Error (400: a request the lower layers
// rejected) or anything else (500); the client always gets the OpenAI error JSON and the server
// keeps serving.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace m3::server {

struct HttpLimits {
  size_t max_body_bytes = 32u << 20;
  // Total bytes of all header lines. cpp-httplib also refuses any single line over 8 KiB (400).
  size_t max_header_bytes = 64u << 10;
  // Connections served at once; each takes one worker thread for its lifetime (a streaming
  // response holds it until the stream ends). Further connections get 503.
  int max_connections = 256;
  int read_timeout_s = 30;   // a client that stops sending mid-request is dropped
  int write_timeout_s = 30;  // a client that stops reading mid-response is dropped
  int keep_alive_timeout_s = 5;
};

class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // `api_keys` empty: no authentication. Otherwise requests to paths for which
  // `needs_auth(path)` is true must send "Authorization: Bearer <one of the keys>".
  HttpServer(HttpLimits limits, std::vector<std::string> api_keys,
             std::function<bool(const std::string& path)> needs_auth);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void get(const std::string& path, Handler handler);
  void post(const std::string& path, Handler handler);

  // Binds (port 0: any free port) and starts serving on a background thread. Returns the port.
  // Throws m3::Error when the address cannot be bound.
  int start(const std::string& host, int port);
  // Stops accepting, closes idle connections and joins the listener; in-flight handlers run to
  // completion first. Idempotent.
  void stop();

  // Connections currently being served (for tests and the shutdown log).
  int active_connections() const;

 private:
  class ConnectionQueue;
  Handler wrap(Handler handler);

  HttpLimits limits_;
  std::vector<std::string> api_keys_;
  std::function<bool(const std::string&)> needs_auth_;
  std::unique_ptr<httplib::Server> server_;
  // The methods registered per path (fixed before start): a known path asked with another
  // method gets 405 with an Allow header, not 404.
  std::map<std::string, std::string> allowed_methods_;
  std::shared_ptr<std::atomic<int>> active_connections_;
  std::thread listener_;
  int listen_socket_ = -1;  // the last socket cpp-httplib created: the listening one after a bind
};

// Sends the OpenAI error JSON.
void send_error(httplib::Response& res, int status, std::string_view message,
                std::string_view param = {});
void send_json(httplib::Response& res, const std::string& body, int status = 200);

}  // namespace m3::server
