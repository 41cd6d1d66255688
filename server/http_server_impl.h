// Internals of server/http_server.h, shared by http_server.cc (the server: routes, auth, accept,
// TLS, shutdown) and http_server_connection.cc (one connection's state machine). Only these two
// files include Boost; nothing else in the project sees this header.
#pragma once
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_server.h"

namespace m3::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// What the server needs of a connection: to close it when stopping.
class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  // Closes the socket at once; a stream in progress sees StreamWriter::on_close. Called on the
  // connection's executor.
  virtual void close_now() = 0;
  virtual net::any_io_executor executor() const = 0;
};

// Starts serving an accepted socket (its executor is the connection's I/O thread). `over_limit`:
// the server is at max_connections; the client gets 503 and the connection closes.
void serve_connection(HttpServer::Impl& server, tcp::socket socket, bool over_limit);

class HttpServer::Impl {
 public:
  Impl(HttpLimits limits, std::vector<std::string> api_keys,
       std::function<bool(const std::string&)> needs_auth, ServerMetrics* metrics);

  const HttpLimits& limits() const { return limits_; }
  ServerMetrics* metrics() const { return metrics_; }
  bool stopping() const { return stopping_; }
  net::ssl::context* tls() { return tls_ ? &*tls_ : nullptr; }
  net::thread_pool& handler_pool() { return *handler_pool_; }

  void add_route(const std::string& method, const std::string& path, Handler handler,
                 ErrorFormat errors = {});
  // Routing, auth and method checks for a parsed request: the handler to run (and whether it
  // runs on the I/O thread), or null with `res` set to the error to send.
  const Handler* route(const HttpRequest& req, HttpResponse& res, bool& run_inline) const;
  // Sets `res` to the error of `status` in the shape of the route at `path` (OpenAI's for a
  // path with no route or no ErrorFormat).
  void send_route_error(const std::string& path, HttpResponse& res, int status,
                        std::string_view message, std::string_view param = {}) const;
  // Runs a handler; whatever it throws becomes the route's error JSON in `res`.
  void run_handler(const Handler& handler, const HttpRequest& req, HttpResponse& res) const;

  // The registry of open connections (max_connections counts them; stop() closes them).
  uint64_t add_connection(std::weak_ptr<ConnectionBase> connection);
  void remove_connection(uint64_t id);
  int active_connections() const;

  int start(const std::string& host, int port);
  void stop();

 private:
  struct Route {
    Handler get;
    Handler post;
    Handler del;
    ErrorFormat errors;  // empty: OpenAI's error JSON
  };
  // The route of `path`: exact, else one with "{}" segments; null when none.
  const Route* find_route(const std::string& path) const;
  void accept();
  bool authorized(const HttpRequest& req) const;

  HttpLimits limits_;
  std::vector<std::string> api_keys_;
  std::function<bool(const std::string&)> needs_auth_;
  ServerMetrics* metrics_;
  std::map<std::string, Route> routes_;  // fixed before start
  // Paths with "{}" segments, by the path as registered.
  std::map<std::string, Route> pattern_routes_;

  // Declared before the io_contexts and the handler pool, so they outlive every connection:
  // handlers still queued when those are destroyed hold connections, whose destructors
  // unregister themselves and whose TLS streams use the context.
  mutable std::mutex connections_mutex_;
  std::condition_variable connections_changed_;
  std::unordered_map<uint64_t, std::weak_ptr<ConnectionBase>> connections_;
  uint64_t next_connection_id_ = 1;
  std::optional<net::ssl::context> tls_;

  // One io_context per I/O thread, each run by its thread alone: a connection lives on one of
  // them (round robin), so its handlers never race and need no strand, and a post from the
  // engine wakes exactly the thread that owns the connection.
  std::vector<std::unique_ptr<net::io_context>> io_;
  std::vector<net::executor_work_guard<net::io_context::executor_type>> work_;
  size_t next_io_ = 0;
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_;
  std::unique_ptr<net::thread_pool> handler_pool_;
  std::vector<std::thread> io_threads_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;

  std::mutex threads_mutex_;
  std::condition_variable threads_done_;
  int io_threads_running_ = 0;
};

}  // namespace m3::server
