#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <exception>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"

namespace m3::server {
namespace {

// Set by ConnectionQueue for the worker thread that serves a connection over the limit; read by
// the pre-routing handler on that same thread. cpp-httplib offers no other way to hand
// per-connection context to a handler.
thread_local bool t_connection_over_limit = false;

bool same_key(std::string_view expected, std::string_view given) {
  if (expected.size() != given.size()) return false;
  // Touch every byte so the time taken does not reveal how long a matching prefix is.
  unsigned char diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ given[i]);
  }
  return diff == 0;
}

size_t header_bytes(const httplib::Request& req) {
  size_t total = req.method.size() + req.target.size() + req.version.size() + 4;
  for (const auto& [name, value] : req.headers) {
    // cpp-httplib adds REMOTE_ADDR / REMOTE_PORT / LOCAL_* pseudo headers; they are small.
    total += name.size() + value.size() + 4;
  }
  return total;
}

}  // namespace

// A worker pool for connections: the first max_connections connections are served normally; a
// few reserve workers answer further connections with 503 (the pre-routing handler sees
// t_connection_over_limit) so an overloaded server still says why instead of stalling.
class HttpServer::ConnectionQueue : public httplib::TaskQueue {
 public:
  ConnectionQueue(int max_connections, std::shared_ptr<std::atomic<int>> active)
      : max_connections_(max_connections),
        active_(std::move(active)),
        pool_(static_cast<size_t>(max_connections) + kReserveWorkers) {}

  void enqueue(std::function<void()> fn) override {
    pool_.enqueue([this, fn = std::move(fn)] {
      int now = ++*active_;
      t_connection_over_limit = now > max_connections_;
      fn();
      t_connection_over_limit = false;
      --*active_;
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  static constexpr size_t kReserveWorkers = 4;
  int max_connections_;
  std::shared_ptr<std::atomic<int>> active_;
  httplib::ThreadPool pool_;
};

void send_json(httplib::Response& res, const std::string& body, int status) {
  res.status = status;
  res.set_content(body, "application/json");
}

void send_error(httplib::Response& res, int status, std::string_view message,
                std::string_view param) {
  send_json(res, error_body(status, message, param), status);
}

HttpServer::HttpServer(HttpLimits limits, std::vector<std::string> api_keys,
                       std::function<bool(const std::string&)> needs_auth)
    : limits_(limits),
      api_keys_(std::move(api_keys)),
      needs_auth_(std::move(needs_auth)),
      server_(std::make_unique<httplib::Server>()),
      active_connections_(std::make_shared<std::atomic<int>>(0)) {
  M3_CHECK(limits_.max_connections >= 1, "max connections must be >= 1, got {}",
           limits_.max_connections);
  auto& s = *server_;
  s.new_task_queue = [max = limits_.max_connections, active = active_connections_] {
    return new ConnectionQueue(max, active);
  };
  s.set_payload_max_length(limits_.max_body_bytes);
  s.set_read_timeout(limits_.read_timeout_s, 0);
  s.set_write_timeout(limits_.write_timeout_s, 0);
  s.set_keep_alive_timeout(limits_.keep_alive_timeout_s);
  s.set_keep_alive_max_count(1000);
  s.set_tcp_nodelay(true);  // SSE events are small; do not let Nagle hold them back
  s.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = static_cast<int>(sock);
  });

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (t_connection_over_limit) {
      res.set_header("Connection", "close");
      send_error(res, 503,
                 fmt::format("the server is at its limit of {} concurrent connections; "
                             "retry later",
                             limits_.max_connections));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (header_bytes(req) > limits_.max_header_bytes) {
      send_error(res, 431,
                 fmt::format("request headers are too large ({} bytes; the limit is {})",
                             header_bytes(req), limits_.max_header_bytes));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!api_keys_.empty() && needs_auth_ && needs_auth_(req.path)) {
      std::string auth = req.get_header_value("Authorization");
      constexpr std::string_view kBearer = "Bearer ";
      bool ok = false;
      if (auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0) {
        std::string_view token = std::string_view(auth).substr(kBearer.size());
        for (const std::string& key : api_keys_) ok = same_key(key, token) || ok;
      }
      if (!ok) {
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, 401,
                   auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                : "invalid API key");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors cpp-httplib produces itself (no route, body too large, unparsable request) arrive
  // here with an empty body; give them the OpenAI shape too.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    switch (res.status) {
      case 404:
        if (auto it = allowed_methods_.find(req.path); it != allowed_methods_.end()) {
          res.set_header("Allow", it->second);
          send_error(res, 405, fmt::format("method {} is not allowed for {} (allowed: {})", req.method,
                                           req.path, it->second));
        } else {
          send_error(res, 404, fmt::format("no route for {} {}", req.method, req.path));
        }
        break;
      case 413:
        send_error(res, 413,
                   fmt::format("request body is too large (the limit is {} bytes)",
                               limits_.max_body_bytes));
        break;
      case 400:
        send_error(res, 400, "malformed HTTP request");
        break;
      default:
        send_error(res, res.status, fmt::format("HTTP error {}", res.status));
    }
  });
  s.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown error";
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        M3_LOG_ERROR("{} {}: internal error: {}", req.method, req.path, what);
        send_error(res, 500, fmt::format("internal server error: {}", what));
      });
}

HttpServer::~HttpServer() { stop(); }

HttpServer::Handler HttpServer::wrap(Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e.status(), e.what(), e.param());
    } catch (const m3::Error& e) {
      send_error(res, 400, e.what());
    } catch (const std::exception& e) {
      M3_LOG_ERROR("{} {}: internal error: {}", req.method, req.path, e.what());
      send_error(res, 500, fmt::format("internal server error: {}", e.what()));
    }
  };
}

void HttpServer::get(const std::string& path, Handler handler) {
  std::string& allowed = allowed_methods_[path];
  allowed += allowed.empty() ? "GET, HEAD" : ", GET, HEAD";
  server_->Get(path, wrap(std::move(handler)));
}

void HttpServer::post(const std::string& path, Handler handler) {
  std::string& allowed = allowed_methods_[path];
  allowed += allowed.empty() ? "POST" : ", POST";
  server_->Post(path, wrap(std::move(handler)));
}

int HttpServer::start(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = server_->bind_to_any_port(host);
    M3_CHECK(bound > 0, "cannot bind {} to a free port", host);
  } else {
    M3_CHECK(server_->bind_to_port(host, port),
             "cannot listen on {}:{} (address in use or not "
             "available; pick another --host/--port)",
             host, port);
  }
  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed in the Debian
  // library): a burst of clients connecting at once overflows it and some see their connection
  // reset. On Linux a second listen() on the listening socket raises its backlog.
  if (listen_socket_ >= 0 && ::listen(listen_socket_, SOMAXCONN) != 0)
    M3_LOG_WARN("could not raise the listen backlog of the HTTP socket; bursts of connections may be reset");
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() only takes effect once the accept loop runs: wait for it, so a stop right after
  // start (a failed model load) cannot leave the listener running and its join hanging.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return bound;
}

void HttpServer::stop() {
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

int HttpServer::active_connections() const { return active_connections_->load(); }

}  // namespace m3::server
