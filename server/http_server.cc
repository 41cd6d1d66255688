#include "server/http_server.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "server/api_error.h"
#include "server/http_server_impl.h"

namespace m3::server {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Constant time in the contents and in the lengths: every byte of the longer string is looked
// at whatever matches, so the time taken reveals neither a matching prefix nor the key's length.
bool same_key(std::string_view expected, std::string_view given) {
  const size_t n = std::max(expected.size(), given.size());
  unsigned diff = expected.size() != given.size() ? 1u : 0u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char e = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned>(e ^ g);
  }
  return diff == 0;
}

// Every connection holds a descriptor: lift the soft open-file limit to the hard one, so the
// connection cap (not the default 1,024 descriptors) is what limits clients.
void raise_open_file_limit(int wanted) {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) != 0) return;
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < static_cast<rlim_t>(wanted) + 64) {
    M3_LOG_WARN(
        "the open-file limit is {} but --max-connections is {}: connections beyond the limit "
        "wait in the listen queue (raise `ulimit -n`)",
        files.rlim_cur, wanted);
  }
}

std::vector<std::unique_ptr<net::io_context>> make_io_contexts(int threads) {
  std::vector<std::unique_ptr<net::io_context>> contexts;
  for (int i = 0; i < std::max(1, threads); ++i) {
    contexts.push_back(std::make_unique<net::io_context>(1));  // 1: run by a single thread
  }
  return contexts;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const HttpHeader& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return {};
}

void HttpResponse::set_header(std::string name, std::string value) {
  for (HttpHeader& h : headers) {
    if (iequals(h.name, name)) {
      h.value = std::move(value);
      return;
    }
  }
  headers.push_back({std::move(name), std::move(value)});
}

void send_json(HttpResponse& res, std::string body, int status) {
  res.status = status;
  res.set_content(std::move(body), "application/json");
}

void send_error(HttpResponse& res, int status, std::string_view message, std::string_view param) {
  send_json(res, error_body(status, message, param), status);
}

HttpServer::Impl::Impl(HttpLimits limits, std::vector<std::string> api_keys,
                       std::function<bool(const std::string&)> needs_auth,
                       ServerMetrics* metrics)
    : limits_(std::move(limits)),
      api_keys_(std::move(api_keys)),
      needs_auth_(std::move(needs_auth)),
      metrics_(metrics),
      io_(make_io_contexts(limits_.io_threads)),
      acceptor_(*io_.front()),
      accept_retry_(*io_.front()) {
  M3_CHECK(limits_.max_connections >= 1, "max connections must be >= 1, got {}",
           limits_.max_connections);
  M3_CHECK(limits_.io_threads >= 1 && limits_.handler_threads >= 1,
           "the HTTP server needs at least one I/O thread and one handler thread");
  M3_CHECK(limits_.ssl_certfile.empty() == limits_.ssl_keyfile.empty(),
           "TLS needs both --ssl-certfile and --ssl-keyfile (got only {})",
           limits_.ssl_certfile.empty() ? "--ssl-keyfile" : "--ssl-certfile");
  for (int t : {limits_.head_timeout_s, limits_.body_timeout_s, limits_.keep_alive_timeout_s,
                limits_.write_timeout_s, limits_.stream_stall_timeout_s}) {
    M3_CHECK(t >= 1, "HTTP timeouts must be at least 1 second, got {}", t);
  }
  if (!limits_.ssl_certfile.empty()) {
    tls_.emplace(net::ssl::context::tls_server);
    tls_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                      net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                      net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
    try {
      tls_->use_certificate_chain_file(limits_.ssl_certfile);
    } catch (const std::exception& e) {
      ::m3::fail("--ssl-certfile {}: cannot load the certificate chain ({})", limits_.ssl_certfile,
              e.what());
    }
    try {
      tls_->use_private_key_file(limits_.ssl_keyfile, net::ssl::context::pem);
    } catch (const std::exception& e) {
      ::m3::fail("--ssl-keyfile {}: cannot load the private key ({})", limits_.ssl_keyfile,
              e.what());
    }
  }
}

void HttpServer::Impl::add_route(const std::string& method, const std::string& path,
                                 Handler handler, ErrorFormat errors) {
  M3_CHECK(!started_, "HTTP routes must be registered before start()");
  Route& route = path.find("/{") != std::string::npos ? pattern_routes_[path] : routes_[path];
  (method == "GET" ? route.get : method == "DELETE" ? route.del : route.post) = std::move(handler);
  if (errors) route.errors = std::move(errors);
}

void HttpServer::Impl::send_route_error(const std::string& path, HttpResponse& res, int status,
                                        std::string_view message, std::string_view param) const {
  const Route* found = find_route(path);
  if (!found || !found->errors) return send_error(res, status, message, param);
  send_json(res, found->errors(status, message, param), status);
}

bool HttpServer::Impl::authorized(const HttpRequest& req) const {
  // Either header may carry the key: OpenAI clients send a Bearer token, Anthropic's x-api-key
  // (some send both, one of them a placeholder).
  std::string_view tokens[2] = {req.header("x-api-key"), {}};
  std::string_view auth = req.header("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() > kBearer.size() && auth.substr(0, kBearer.size()) == kBearer) {
    tokens[1] = auth.substr(kBearer.size());
  }
  bool ok = false;
  // Every key is compared (no early exit): the time does not tell which one nearly matched.
  for (std::string_view token : tokens) {
    if (token.empty()) continue;
    for (const std::string& key : api_keys_) ok = same_key(key, token) || ok;
  }
  return ok;
}

namespace {

// Whether `path` matches `pattern` segment by segment, "{}" standing for any non-empty one and a
// final "{...}" for the non-empty rest of the path, slashes included.
bool matches(std::string_view pattern, std::string_view path) {
  for (;;) {
    const size_t p = pattern.find('/'), q = path.find('/');
    const std::string_view want = pattern.substr(0, p), got = path.substr(0, q);
    if (want == "{...}" && p == std::string_view::npos) return !path.empty();
    if (want == "{}" ? got.empty() : want != got) return false;
    if (p == std::string_view::npos || q == std::string_view::npos) {
      return p == std::string_view::npos && q == std::string_view::npos;
    }
    pattern.remove_prefix(p + 1);
    path.remove_prefix(q + 1);
  }
}

}  // namespace

const HttpServer::Impl::Route* HttpServer::Impl::find_route(const std::string& path) const {
  if (auto it = routes_.find(path); it != routes_.end()) return &it->second;
  for (const auto& [pattern, route] : pattern_routes_) {
    if (matches(pattern, path)) return &route;
  }
  return nullptr;
}

const HttpServer::Handler* HttpServer::Impl::route(const HttpRequest& req, HttpResponse& res,
                                                   bool& run_inline) const {
  const Route* found = find_route(req.path);
  if (!found) {
    send_error(res, 404, fmt::format("no route for {} {}", req.method, req.path));
    return nullptr;
  }
  const Route& route = *found;
  const Handler* handler = nullptr;
  if ((req.method == "GET" || req.method == "HEAD") && route.get) {
    handler = &route.get;
    run_inline = true;
  } else if (req.method == "POST" && route.post) {
    handler = &route.post;
    run_inline = false;
  } else if (req.method == "DELETE" && route.del) {
    handler = &route.del;
    run_inline = true;
  }
  if (!handler) {
    std::string allowed = route.get ? "GET, HEAD" : "";
    if (route.post) allowed += allowed.empty() ? "POST" : ", POST";
    if (route.del) allowed += allowed.empty() ? "DELETE" : ", DELETE";
    res.set_header("Allow", allowed);
    send_route_error(req.path, res, 405,
                     fmt::format("method {} is not allowed for {} (allowed: {})", req.method,
                                 req.path, allowed));
    return nullptr;
  }
  if (!api_keys_.empty() && needs_auth_ && needs_auth_(req.path) && !authorized(req)) {
    res.set_header("WWW-Authenticate", "Bearer");
    const bool none = req.header("Authorization").empty() && req.header("x-api-key").empty();
    send_route_error(req.path, res, 401,
                     none ? "missing API key: send 'Authorization: Bearer <key>' or "
                            "'x-api-key: <key>'"
                          : "invalid API key");
    return nullptr;
  }
  return handler;
}

void HttpServer::Impl::run_handler(const Handler& handler, const HttpRequest& req,
                                   HttpResponse& res) const {
  try {
    handler(req, res);
  } catch (const ApiError& e) {
    res = HttpResponse{};
    send_route_error(req.path, res, e.status(), e.what(), e.param());
  } catch (const m3::Error& e) {
    res = HttpResponse{};
    send_route_error(req.path, res, 400, e.what());
  } catch (const std::exception& e) {
    M3_LOG_ERROR("{} {}: internal error: {}", req.method, req.path, e.what());
    res = HttpResponse{};
    send_route_error(req.path, res, 500, fmt::format("internal server error: {}", e.what()));
  }
}

uint64_t HttpServer::Impl::add_connection(std::weak_ptr<ConnectionBase> connection) {
  std::lock_guard lock(connections_mutex_);
  const uint64_t id = next_connection_id_++;
  connections_.emplace(id, std::move(connection));
  return id;
}

void HttpServer::Impl::remove_connection(uint64_t id) {
  {
    std::lock_guard lock(connections_mutex_);
    connections_.erase(id);
  }
  connections_changed_.notify_all();
}

int HttpServer::Impl::active_connections() const {
  std::lock_guard lock(connections_mutex_);
  return static_cast<int>(connections_.size());
}

int HttpServer::Impl::start(const std::string& host, int port) {
  M3_CHECK(!started_, "the HTTP server is already started");
  raise_open_file_limit(limits_.max_connections);
  boost::system::error_code ec;
  auto address = net::ip::make_address(host, ec);
  M3_CHECK(!ec, "cannot listen on '{}': not an IP address ({})", host, ec.message());
  tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  // A burst of clients connecting at once must queue, not be reset: the largest backlog.
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  M3_CHECK(!ec,
           "cannot listen on {}:{} ({}; address in use or not available: pick another "
           "--host/--port)",
           host, port, ec.message());
  const int bound = acceptor_.local_endpoint().port();
  started_ = true;
  handler_pool_ = std::make_unique<net::thread_pool>(limits_.handler_threads);
  for (auto& io : io_) work_.push_back(net::make_work_guard(*io));
  accept();
  io_threads_running_ = static_cast<int>(io_.size());
  for (auto& context : io_) {
    io_threads_.emplace_back([this, io = context.get()] {
      for (;;) {
        try {
          io->run();
          break;
        } catch (const std::exception& e) {
          // A handler threw past every catch (a bug): log it and keep the thread serving.
          M3_LOG_ERROR("HTTP I/O thread: {}", e.what());
        }
      }
      std::lock_guard lock(threads_mutex_);
      --io_threads_running_;
      threads_done_.notify_all();
    });
  }
  return bound;
}

void HttpServer::Impl::accept() {
  net::io_context& target = *io_[next_io_++ % io_.size()];
  acceptor_.async_accept(target, [this](boost::system::error_code ec, tcp::socket socket) {
    if (stopping_ || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE/ENFILE) or a transient error: retry shortly rather than spin.
      M3_LOG_WARN("HTTP accept failed: {}; retrying in 50 ms", ec.message());
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec && !stopping_) accept();
      });
      return;
    }
    boost::system::error_code option_ec;
    socket.set_option(tcp::no_delay(true), option_ec);  // SSE events are small: no Nagle delay
    const bool over_limit = active_connections() >= limits_.max_connections;
    serve_connection(*this, std::move(socket), over_limit);
    accept();
  });
}

void HttpServer::Impl::stop() {
  if (!started_ || stopping_.exchange(true)) return;
  net::post(*io_.front(), [this] {
    boost::system::error_code ec;
    acceptor_.close(ec);
    accept_retry_.cancel();
  });
  // Close every connection on its own executor; streams in progress see on_close and abort.
  std::vector<std::shared_ptr<ConnectionBase>> open;
  {
    std::lock_guard lock(connections_mutex_);
    for (auto& [id, weak] : connections_) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) net::post(c->executor(), [c] { c->close_now(); });
  open.clear();
  // Handlers already running finish (their responses are then dropped).
  handler_pool_->join();
  {
    std::unique_lock lock(connections_mutex_);
    connections_changed_.wait_for(lock, std::chrono::seconds(5),
                                  [&] { return connections_.empty(); });
  }
  // With the work guard gone the I/O threads return once every pending operation has completed
  // (closed sockets and cancelled timers complete at once); a stuck one is stopped after 10 s.
  work_.clear();
  {
    std::unique_lock lock(threads_mutex_);
    if (!threads_done_.wait_for(lock, std::chrono::seconds(10),
                                [&] { return io_threads_running_ == 0; })) {
      M3_LOG_WARN("HTTP server: I/O still pending after 10 s; stopping it");
      for (auto& io : io_) io->stop();
    }
  }
  for (auto& t : io_threads_) t.join();
  io_threads_.clear();
}

HttpServer::HttpServer(HttpLimits limits, std::vector<std::string> api_keys,
                       std::function<bool(const std::string&)> needs_auth, ServerMetrics* metrics)
    : impl_(std::make_unique<Impl>(std::move(limits), std::move(api_keys), std::move(needs_auth),
                                   metrics)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::get(const std::string& path, Handler handler) {
  impl_->add_route("GET", path, std::move(handler));
}

void HttpServer::post(const std::string& path, Handler handler, ErrorFormat errors) {
  impl_->add_route("POST", path, std::move(handler), std::move(errors));
}

void HttpServer::del(const std::string& path, Handler handler) {
  impl_->add_route("DELETE", path, std::move(handler));
}

int HttpServer::start(const std::string& host, int port) { return impl_->start(host, port); }

void HttpServer::stop() { impl_->stop(); }

int HttpServer::active_connections() const { return impl_->active_connections(); }

}  // namespace m3::server
