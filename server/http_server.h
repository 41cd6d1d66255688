// The HTTP/1.1 front end: Boost.Beast's parser over Asio sockets (plain or TLS), event-driven.
// A connection is a little asynchronous state, not a thread: a few I/O threads serve every
// connection, and route handlers that do real work (POST) run on a small handler pool so a slow
// one never holds up another connection's I/O. Everything the library offers stays inside
// server/http_server*.cc; routes see the plain types below.
//
// What a client can and cannot do (HttpLimits):
//   - the whole request head must arrive within head_timeout_s of its first byte, and the whole
//     body within body_timeout_s of the head (slow-loris clients are dropped, and cost nothing
//     but their socket while they last);
//   - a body over max_body_bytes gets 413 as soon as the limit is passed, Content-Length or
//     chunked; a malformed, negative, overflowing or duplicated Content-Length gets 400 at once;
//     headers over max_header_bytes or max_header_count get 431;
//   - pipelined requests are answered one after another, in order;
//   - an idle keep-alive connection is closed after keep_alive_timeout_s;
//   - max_connections is the only cap on connections; beyond it a client gets 503 at once;
//   - a streamed response whose client reads nothing for stream_stall_timeout_s is dropped, and
//     the route learns it (StreamWriter::on_close) so the work behind it is aborted.
//
// Route handlers may throw ApiError (status + message), m3::Error (400: a request the lower layers
// rejected) or anything else (500); the client always gets an error JSON and the server keeps
// serving. The error JSON is OpenAI's unless the route was registered with its own ErrorFormat
// (/v1/messages answers in Anthropic's shape); that format also covers the route's 401, 405 and
// the limits found once its head is read (413, 431, 408). Errors before the request line is
// known (malformed heads, 503 at the connection limit) are OpenAI's.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::server {

struct HttpLimits {
  size_t max_body_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;  // request line and header lines together
  int max_header_count = 128;
  // Open connections, idle ones included (16,384: well above the streams an engine batches, far
  // below the file descriptors a process may hold). Further connections get 503 and are closed.
  int max_connections = 16384;
  int head_timeout_s = 10;       // first byte of a request -> end of its head
  int body_timeout_s = 60;       // end of the head -> end of the body
  int keep_alive_timeout_s = 5;  // idle between requests on one connection
  int write_timeout_s = 30;      // a whole (non-streamed) response must be taken within this
  // A stream whose client has taken no byte for this long is dropped and its request aborted.
  int stream_stall_timeout_s = 30;
  // Unsent bytes one stream may queue; past it the route produces nothing more until the client
  // catches up (StreamWriter::writable), so a slow reader costs a bounded amount of memory.
  size_t stream_buffer_bytes = 256u << 10;
  int io_threads = 2;       // threads running the sockets of every connection
  int handler_threads = 4;  // threads running POST handlers (parsing, templates, tokenization)
  // TLS: both set, or neither (plain HTTP). PEM files.
  std::string ssl_certfile;
  std::string ssl_keyfile;
};

struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // the target up to '?'
  std::vector<HttpHeader> headers;
  std::string body;

  // The first header of that name (names compare case-insensitively); empty when absent.
  std::string_view header(std::string_view name) const;
};

class StreamWriter;

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<HttpHeader> headers;

  void set_header(std::string name, std::string value);
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  // A body produced after the handler returns (an SSE stream, or a body that waits for
  // generation): the status and headers go out at once with chunked transfer encoding, then the
  // connection calls `producer` on its thread with the writer of the body.
  std::function<void(std::shared_ptr<StreamWriter>)> producer;
};

// The body of a response with a producer. Every method but post() must be called on the
// connection's thread: in the producer, in a task it posted, or in an on_* callback.
class StreamWriter {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~StreamWriter() = default;

  // Runs `task` on the connection's thread, after the tasks posted before it; safe from any
  // thread (an engine output sink posts here). Dropped if the stream has ended by then.
  virtual void post(std::function<void()> task) = 0;
  // Queues bytes as one chunk; false when the stream is over (nothing is queued). `produced_at`
  // (when set) is when the data left the engine: the latency to the socket is recorded in
  // m3:token_to_socket_seconds once the bytes are written.
  virtual bool write(std::string bytes, Clock::time_point produced_at = {}) = 0;
  // Ends the body; the connection goes on with its next request.
  virtual void finish() = 0;
  // False while the unsent bytes exceed HttpLimits::stream_buffer_bytes: produce nothing more
  // until `on_writable` fires.
  virtual bool writable() const = 0;
  // `callback` runs once, when the client has taken enough of the backlog (immediately if
  // writable already).
  virtual void on_writable(std::function<void()> callback) = 0;
  // `callback` runs once if the stream ends before finish(): the client went away, stopped
  // reading for the stall timeout, or the server is stopping. The producer should abort its
  // work. Afterwards write() returns false.
  virtual void on_close(std::function<void()> callback) = 0;
};

class ServerMetrics;

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // The body of an error response of a route: (status, message, the field at fault or empty).
  using ErrorFormat =
      std::function<std::string(int status, std::string_view message, std::string_view param)>;

  // `api_keys` empty: no authentication. Otherwise requests to paths for which
  // `needs_auth(path)` is true must send "Authorization: Bearer <one of the keys>" or
  // "x-api-key: <one of the keys>" (the header Anthropic's clients send); either header may
  // carry the key.
  // `metrics` (may be null) receives m3:token_to_socket_seconds.
  HttpServer(HttpLimits limits, std::vector<std::string> api_keys,
             std::function<bool(const std::string& path)> needs_auth,
             ServerMetrics* metrics = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // GET (and HEAD) handlers run on an I/O thread: they must be quick (health, metrics, lists).
  void get(const std::string& path, Handler handler);
  // POST handlers run on the handler pool. `errors` (empty: OpenAI's error JSON) formats every
  // error this path answers with.
  void post(const std::string& path, Handler handler, ErrorFormat errors = {});
  // DELETE handlers run on an I/O thread, as GET ones: they must be quick.
  void del(const std::string& path, Handler handler);
  // A "{}" segment of a path matches any one non-empty segment ("/v1/responses/{}" matches
  // "/v1/responses/resp_1", "/v1/responses/{}/input_items" its input items), and a final "{...}"
  // the non-empty rest ("/v1/models/{...}" matches "/v1/models/org/name"); the handler reads the
  // segments from HttpRequest::path. Exact paths are tried first.

  // Binds (port 0: any free port) and starts serving on background threads. Returns the port.
  // Throws m3::Error when the address cannot be bound or the TLS files cannot be loaded.
  int start(const std::string& host, int port);
  // Stops accepting, closes every connection (streams in progress see on_close) and joins the
  // threads; handlers already running finish first. Idempotent.
  void stop();

  // Connections currently open (for tests and the shutdown log).
  int active_connections() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Sets the OpenAI error JSON as the response.
void send_error(HttpResponse& res, int status, std::string_view message,
                std::string_view param = {});
void send_json(HttpResponse& res, std::string body, int status = 200);

}  // namespace m3::server
