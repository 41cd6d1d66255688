// One HTTP/1.1 connection as asynchronous state on its I/O thread: read bytes, feed Beast's request
// parser (so limits and deadlines are checked as bytes arrive, not after buffering), hand the
// request to its route, write the response, and go on with the next (pipelined) request.
//
// One read is kept outstanding even while a request is being handled or streamed: that is how a
// client that hangs up is noticed at once (its stream is closed and the route aborts the work);
// bytes of pipelined requests read meanwhile wait in the input buffer, bounded.
#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <type_traits>

#include "core/log.h"
#include "server/api_error.h"
#include "server/http_server_impl.h"
#include "server/metrics.h"

namespace m3::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using Clock = std::chrono::steady_clock;

// Bytes of later requests a connection reads ahead while it answers one (pipelining).
constexpr size_t kReadAheadBytes = 64u << 10;
constexpr size_t kReadChunk = 16u << 10;
// After a response that ends the connection, what the client still sends is read and dropped
// for this long, so closing does not reset the connection before the client read the answer.
constexpr auto kLingerTime = std::chrono::seconds(2);

std::string str(beast::string_view s) { return std::string(s.data(), s.size()); }

// The connection's side of a StreamWriter.
class StreamOwner {
 public:
  virtual ~StreamOwner() = default;
  virtual void stream_write(std::string bytes, Clock::time_point produced_at) = 0;
  virtual void stream_finish() = 0;
  virtual bool stream_writable() const = 0;
};

class ResponseStream final : public StreamWriter,
                             public std::enable_shared_from_this<ResponseStream> {
 public:
  ResponseStream(net::any_io_executor executor, StreamOwner* owner)
      : executor_(std::move(executor)), owner_(owner) {}

  void post(std::function<void()> task) override {
    net::post(executor_, [self = shared_from_this(), task = std::move(task)] {
      if (self->owner_) task();
    });
  }
  bool write(std::string bytes, Clock::time_point produced_at) override {
    if (!owner_) return false;
    if (!bytes.empty()) owner_->stream_write(std::move(bytes), produced_at);
    return true;
  }
  void finish() override {
    if (!owner_) return;
    auto keep = shared_from_this();
    StreamOwner* owner = owner_;
    detach();
    owner->stream_finish();
  }
  bool writable() const override { return owner_ && owner_->stream_writable(); }
  void on_writable(std::function<void()> callback) override {
    if (!owner_) return;
    if (owner_->stream_writable()) {
      post(std::move(callback));
    } else {
      writable_callback_ = std::move(callback);
    }
  }
  void on_close(std::function<void()> callback) override {
    if (owner_) close_callback_ = std::move(callback);
  }

  // The connection's calls, on its executor.
  bool waiting_for_room() const { return static_cast<bool>(writable_callback_); }
  void notify_writable() {
    if (auto callback = std::exchange(writable_callback_, nullptr)) callback();
  }
  void detach_closed() {
    auto keep = shared_from_this();
    auto callback = std::exchange(close_callback_, nullptr);
    detach();
    if (callback) callback();
  }

 private:
  void detach() {
    owner_ = nullptr;
    writable_callback_ = nullptr;
    close_callback_ = nullptr;
  }

  net::any_io_executor executor_;
  StreamOwner* owner_;  // null once the stream is over
  std::function<void()> writable_callback_;
  std::function<void()> close_callback_;
};

struct Outgoing {
  std::string bytes;
  Clock::time_point produced_at;  // set for stream chunks carrying engine output
};

template <class Stream>
class Connection final : public ConnectionBase,
                         public StreamOwner,
                         public std::enable_shared_from_this<Connection<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

 public:
  template <class... StreamArgs>
  Connection(HttpServer::Impl& server, StreamArgs&&... stream_args)
      : server_(server),
        limits_(server.limits()),
        stream_(std::forward<StreamArgs>(stream_args)...),
        executor_(socket().get_executor()),
        read_timer_(executor_),
        write_timer_(executor_),
        input_(limits_.max_header_bytes + kReadAheadBytes + kReadChunk) {}

  ~Connection() override {
    if (id_) server_.remove_connection(id_);
  }

  void start(bool over_limit) {
    if (!over_limit) id_ = server_.add_connection(this->weak_from_this());
    boost::system::error_code ec;
    socket().non_blocking(true, ec);
    if constexpr (kTls) {
      arm_read_timer(limits_.head_timeout_s);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this(), over_limit](
                                  boost::system::error_code handshake_ec) {
                                self->disarm_read_timer();
                                if (handshake_ec || self->closed_) return self->close_now();
                                self->begin(over_limit);
                              });
    } else {
      begin(over_limit);
    }
  }

  void close_now() override {
    if (closed_) return;
    closed_ = true;
    disarm_read_timer();
    write_timer_.cancel();
    boost::system::error_code ec;
    socket().shutdown(tcp::socket::shutdown_both, ec);
    socket().close(ec);
    if (stream_writer_) std::exchange(stream_writer_, nullptr)->detach_closed();
  }

  net::any_io_executor executor() const override { return executor_; }

  // StreamOwner.
  void stream_write(std::string bytes, Clock::time_point produced_at) override {
    queue(fmt::format("{:x}\r\n", bytes.size()) + bytes + "\r\n", produced_at);
  }
  void stream_finish() override {
    stream_writer_.reset();
    response_complete_ = true;
    queue("0\r\n\r\n");
  }
  bool stream_writable() const override { return unsent_bytes_ < limits_.stream_buffer_bytes; }

 private:
  enum class Phase {
    kIdle,        // between requests: waiting for the first byte (keep-alive timeout)
    kHead,        // reading the request head (head deadline)
    kBody,        // reading the body (body deadline)
    kHandling,    // the route runs
    kResponding,  // the response is being written (streamed)
    kClosing,     // the last response is out; dropping input until the client closes
  };

  tcp::socket& socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  void begin(bool over_limit) {
    if (over_limit) {
      send_error_and_close(503, fmt::format("the server is at its limit of {} concurrent "
                                            "connections; retry later",
                                            limits_.max_connections));
      return;
    }
    begin_request(/*first=*/true);
  }

  void begin_request(bool first) {
    phase_ = Phase::kIdle;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
    parser_->body_limit(limits_.max_body_bytes);
    parser_->eager(true);
    // A new connection must send its request head within the head deadline; a kept-alive one
    // may idle for the keep-alive timeout first.
    arm_read_timer(first ? limits_.head_timeout_s : limits_.keep_alive_timeout_s);
    if (input_.size() > 0) {
      parse();
    } else {
      read();
    }
  }

  // ---- reading ----

  void read() {
    if (reading_ || closed_) return;
    const size_t room = input_.max_size() - input_.size();
    if (room == 0) return;  // resumed by begin_request once the buffered requests are parsed
    reading_ = true;
    if constexpr (!kTls) {
      if (input_.size() == 0) {
        // Idle: wait until the socket is readable before taking a buffer, so ten thousand idle
        // connections hold no read buffers.
        input_.shrink_to_fit();
        socket().async_wait(tcp::socket::wait_read,
                            [self = this->shared_from_this()](boost::system::error_code ec) {
                              self->on_readable(ec);
                            });
        return;
      }
    }
    stream_.async_read_some(input_.prepare(std::min(room, kReadChunk)),
                            [self = this->shared_from_this()](boost::system::error_code ec,
                                                              size_t n) { self->on_read(ec, n); });
  }

  void on_readable(boost::system::error_code ec) {
    if (ec) return on_read(ec, 0);
    const size_t room = input_.max_size() - input_.size();
    size_t n = socket().read_some(input_.prepare(std::min(room, kReadChunk)), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) {
      reading_ = false;
      return read();
    }
    on_read(ec, n);
  }

  void on_read(boost::system::error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      // The client closed or reset the connection: whatever it was waiting for is abandoned.
      return close_now();
    }
    input_.commit(n);
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kHead:
      case Phase::kBody:
        return parse();
      case Phase::kHandling:
      case Phase::kResponding:
        if (input_.size() < kReadAheadBytes) read();
        return;
      case Phase::kClosing:
        input_.consume(input_.size());
        return read();
    }
  }

  void parse() {
    if (phase_ == Phase::kIdle && input_.size() > 0) {
      phase_ = Phase::kHead;
      arm_read_timer(limits_.head_timeout_s);
    }
    while (input_.size() > 0 && !parser_->is_done()) {
      beast::error_code ec;
      const size_t used = parser_->put(input_.data(), ec);
      input_.consume(used);
      if (ec == http::error::need_more) break;
      if (ec) return reject(ec);
      if (phase_ == Phase::kHead && parser_->is_header_done() && !on_head()) return;
      if (used == 0) break;
    }
    if (parser_->is_done()) return dispatch();
    read();
  }

  // The head is complete: checks Beast does not make, then the body deadline.
  bool on_head() {
    const auto& message = parser_->get();
    const auto count = std::distance(message.begin(), message.end());
    if (count > limits_.max_header_count) {
      send_error_and_close(431, fmt::format("the request has {} header fields; the limit is {}",
                                            count, limits_.max_header_count));
      return false;
    }
    if (message.count(http::field::content_length) > 1) {
      send_error_and_close(400, "the request has more than one Content-Length header");
      return false;
    }
    phase_ = Phase::kBody;
    arm_read_timer(limits_.body_timeout_s);
    if (!parser_->is_done() && beast::iequals(message[http::field::expect], "100-continue")) {
      queue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    return true;
  }

  void reject(const beast::error_code& ec) {
    if (ec == http::error::body_limit) {
      return send_error_and_close(413, fmt::format("request body is too large (the limit is {} "
                                                   "bytes)",
                                                   limits_.max_body_bytes));
    }
    if (ec == http::error::header_limit) {
      return send_error_and_close(431, fmt::format("request headers are too large (the limit is "
                                                   "{} bytes)",
                                                   limits_.max_header_bytes));
    }
    if (ec == http::error::bad_content_length) {
      return send_error_and_close(400, "malformed HTTP request: the Content-Length header is not "
                                       "a valid length");
    }
    send_error_and_close(400, fmt::format("malformed HTTP request: {}", ec.message()));
  }

  void dispatch() {
    disarm_read_timer();
    auto message = parser_->release();
    parser_.reset();
    keep_alive_ = message.keep_alive();
    HttpRequest req;
    req.method = str(message.method_string());
    req.target = str(message.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& field : message) req.headers.push_back({str(field.name_string()), str(field.value())});
    req.body = std::move(message.body());
    head_only_ = req.method == "HEAD";
    phase_ = Phase::kHandling;
    read();  // watch for a hang-up while the route works

    HttpResponse res;
    bool run_inline = false;
    const HttpServer::Handler* handler = server_.route(req, res, run_inline);
    if (!handler) return respond(std::move(res));
    if (run_inline) {
      server_.run_handler(*handler, req, res);
      return respond(std::move(res));
    }
    net::post(server_.handler_pool(),
              [self = this->shared_from_this(), handler, req = std::move(req)] {
                auto res = std::make_shared<HttpResponse>();
                self->server_.run_handler(*handler, req, *res);
                net::post(self->executor_, [self, res] { self->respond(std::move(*res)); });
              });
  }

  // ---- writing ----

  void respond(HttpResponse res) {
    if (closed_) return;  // the client left; dropping `res` aborts whatever it started
    if (server_.stopping()) keep_alive_ = false;
    std::string head = fmt::format("HTTP/1.1 {} {}\r\n", res.status,
                                   str(http::obsolete_reason(static_cast<http::status>(res.status))));
    for (const HttpHeader& h : res.headers) fmt::format_to(std::back_inserter(head), "{}: {}\r\n", h.name, h.value);
    if (!res.content_type.empty()) fmt::format_to(std::back_inserter(head), "Content-Type: {}\r\n", res.content_type);
    if (res.producer) {
      head += "Transfer-Encoding: chunked\r\n";
    } else {
      fmt::format_to(std::back_inserter(head), "Content-Length: {}\r\n", res.body.size());
    }
    if (!keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    phase_ = Phase::kResponding;
    if (!res.producer) {
      response_complete_ = true;
      if (!head_only_) head += res.body;
      return queue(std::move(head));
    }
    queue(std::move(head));
    stream_writer_ = std::make_shared<ResponseStream>(executor_, this);
    try {
      res.producer(stream_writer_);
    } catch (const std::exception& e) {
      // The status is on the wire already: all that is left is to end the connection.
      M3_LOG_ERROR("response stream failed to start: {}", e.what());
      close_now();
    }
  }

  void send_error_and_close(int status, std::string_view message) {
    keep_alive_ = false;
    HttpResponse res;
    // Once the request line is read the route is known, and the error takes the route's shape
    // (Beast fills the target in as soon as the line is parsed; empty before).
    std::string path;
    if (parser_) {
      path = str(parser_->get().target());
      path.resize(std::min(path.size(), path.find('?')));
    }
    server_.send_route_error(path, res, status, message);
    disarm_read_timer();
    respond(std::move(res));
  }

  void queue(std::string bytes, Clock::time_point produced_at = {}) {
    if (closed_) return;
    unsent_bytes_ += bytes.size();
    out_.push_back({std::move(bytes), produced_at});
    write();
  }

  // Plain TCP writes at once, while the socket takes bytes (the bytes are on the socket when
  // this returns, which is what m3:token_to_socket_seconds measures), and waits for room only
  // when the socket is full. TLS writes through the stream's asynchronous operation.
  void write() {
    if (writing_ || out_.empty() || closed_) return;
    if constexpr (!kTls) {
      while (!out_.empty()) {
        gather_buffers();
        boost::system::error_code ec;
        const size_t n = socket().write_some(buffers_, ec);
        if (ec == net::error::would_block || ec == net::error::try_again) return wait_writable();
        if (ec) return close_now();
        consume_written(n);
      }
      // What follows a drained queue (the next pipelined request, the producer's next chunks)
      // runs as its own handler, so it never recurses into this call.
      if (response_complete_ || (stream_writer_ && stream_writer_->waiting_for_room())) {
        net::post(executor_, [self = this->shared_from_this()] { self->after_written(); });
      }
    } else {
      gather_buffers();
      writing_ = true;
      arm_write_timer(write_limit_s());
      stream_.async_write_some(buffers_, [self = this->shared_from_this()](
                                             boost::system::error_code ec, size_t n) {
        self->writing_ = false;
        if (self->closed_) return;
        if (ec) return self->close_now();
        self->consume_written(n);
        if (!self->out_.empty()) return self->write();
        self->after_written();
      });
    }
  }

  // A stream may wait on the engine between writes; only a write the client does not take
  // counts against it.
  int write_limit_s() const {
    return stream_writer_ || !response_complete_ ? limits_.stream_stall_timeout_s
                                                 : limits_.write_timeout_s;
  }

  void gather_buffers() {
    buffers_.clear();
    size_t offset = out_offset_;
    for (const Outgoing& o : out_) {
      buffers_.emplace_back(o.bytes.data() + offset, o.bytes.size() - offset);
      offset = 0;
      if (buffers_.size() == 64) break;
    }
  }

  void wait_writable() {
    writing_ = true;
    arm_write_timer(write_limit_s());
    socket().async_wait(tcp::socket::wait_write,
                        [self = this->shared_from_this()](boost::system::error_code ec) {
                          self->writing_ = false;
                          if (self->closed_) return;
                          if (ec) return self->close_now();
                          self->write();
                        });
  }

  void consume_written(size_t n) {
    unsent_bytes_ -= n;
    const auto now = Clock::now();
    while (n > 0) {
      Outgoing& front = out_.front();
      const size_t left = front.bytes.size() - out_offset_;
      if (n < left) {
        out_offset_ += n;
        break;
      }
      n -= left;
      if (front.produced_at != Clock::time_point{} && server_.metrics()) {
        server_.metrics()->observe_token_to_socket(
            std::chrono::duration<double>(now - front.produced_at).count());
      }
      out_.pop_front();
      out_offset_ = 0;
    }
  }

  void after_written() {
    if (closed_ || writing_) return;
    if (!out_.empty()) return write();  // more was queued meanwhile
    if (response_complete_) return end_response();
    if (stream_writer_ && stream_writable()) stream_writer_->notify_writable();
  }

  void end_response() {
    response_complete_ = false;
    stream_writer_.reset();
    if (!keep_alive_ || server_.stopping()) return linger_and_close();
    begin_request(/*first=*/false);
  }

  // The last response is written: stop sending, read and drop what the client still sends for a
  // moment, then close.
  void linger_and_close() {
    phase_ = Phase::kClosing;
    if constexpr (kTls) {
      return close_now();  // TLS has no half-close worth waiting for
    } else {
      boost::system::error_code ec;
      socket().shutdown(tcp::socket::shutdown_send, ec);
      input_.consume(input_.size());
      read_seq_++;
      read_timer_.expires_after(kLingerTime);
      read_timer_.async_wait([self = this->shared_from_this(), seq = read_seq_](
                                 boost::system::error_code timer_ec) {
        if (!timer_ec && seq == self->read_seq_) self->close_now();
      });
      read();
    }
  }

  // ---- deadlines ----

  void arm_read_timer(int seconds) {
    const uint64_t seq = ++read_seq_;
    read_timer_.expires_after(std::chrono::seconds(seconds));
    read_timer_.async_wait([self = this->shared_from_this(), seq](boost::system::error_code ec) {
      if (ec || seq != self->read_seq_ || self->closed_) return;
      self->on_read_deadline();
    });
  }
  void disarm_read_timer() {
    ++read_seq_;
    read_timer_.cancel();
  }

  void on_read_deadline() {
    switch (phase_) {
      case Phase::kIdle:
        return close_now();  // keep-alive timeout (or a client that never sent a byte)
      case Phase::kHead:
      case Phase::kBody:
        // Slow-loris, or a client that stalled mid-request: answer 408 and drop it.
        return send_error_and_close(408, fmt::format("the request {} did not arrive in time "
                                                     "(the limit is {} s)",
                                                     phase_ == Phase::kHead ? "head" : "body",
                                                     phase_ == Phase::kHead
                                                         ? limits_.head_timeout_s
                                                         : limits_.body_timeout_s));
      default:
        return;
    }
  }

  // The write deadline is checked by a timer that is armed once per deadline period, not per
  // write (thousands of streams write a token each per engine step): each write notes when it
  // started, and the check drops the client when the write in progress is older than the limit.
  void arm_write_timer(int seconds) {
    write_started_ = Clock::now();
    write_limit_ = std::chrono::seconds(seconds);
    if (!write_timer_armed_) schedule_write_check(write_limit_);
  }
  void schedule_write_check(Clock::duration after) {
    write_timer_armed_ = true;
    write_timer_.expires_after(after);
    write_timer_.async_wait([self = this->shared_from_this()](boost::system::error_code ec) {
      self->on_write_check(ec);
    });
  }
  void on_write_check(boost::system::error_code ec) {
    write_timer_armed_ = false;
    if (ec || closed_ || !writing_) return;  // no write pending: the next one re-arms
    const auto waited = Clock::now() - write_started_;
    if (waited < write_limit_) return schedule_write_check(write_limit_ - waited);
    M3_LOG_INFO("dropping a client that took no response bytes for {} s",
                std::chrono::duration_cast<std::chrono::seconds>(write_limit_).count());
    close_now();
  }

  HttpServer::Impl& server_;
  const HttpLimits& limits_;
  Stream stream_;
  net::any_io_executor executor_;
  net::steady_timer read_timer_;
  net::steady_timer write_timer_;
  uint64_t read_seq_ = 0;
  bool write_timer_armed_ = false;
  Clock::time_point write_started_;
  Clock::duration write_limit_{};
  uint64_t id_ = 0;  // in the server's registry (0: a 503 connection, not counted)

  beast::flat_buffer input_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  bool reading_ = false;
  bool closed_ = false;
  bool keep_alive_ = true;
  bool head_only_ = false;

  std::deque<Outgoing> out_;
  size_t out_offset_ = 0;  // bytes of out_.front() already written
  size_t unsent_bytes_ = 0;
  std::vector<net::const_buffer> buffers_;
  bool writing_ = false;
  bool response_complete_ = false;  // the whole response is queued
  std::shared_ptr<ResponseStream> stream_writer_;
};

}  // namespace

void serve_connection(HttpServer::Impl& server, tcp::socket socket, bool over_limit) {
  if (net::ssl::context* tls = server.tls()) {
    auto c = std::make_shared<Connection<net::ssl::stream<tcp::socket>>>(server, std::move(socket),
                                                                         *tls);
    c->start(over_limit);
  } else {
    auto c = std::make_shared<Connection<tcp::socket>>(server, std::move(socket));
    c->start(over_limit);
  }
}

}  // namespace m3::server
