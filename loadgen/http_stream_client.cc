#include "loadgen/http_stream_client.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>

#include "core/error.h"

namespace m3::loadgen {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

Endpoint Endpoint::parse(const std::string& base_url) {
  const std::string scheme = "http://";
  M3_CHECK(base_url.rfind(scheme, 0) == 0, "'{}': expected http://HOST:PORT (https is not supported)", base_url);
  std::string authority = base_url.substr(scheme.size());
  authority = authority.substr(0, authority.find('/'));
  Endpoint e;
  const size_t colon = authority.rfind(':');
  e.host = authority.substr(0, colon);
  e.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  M3_CHECK(!e.host.empty() && !e.port.empty(), "'{}': no host or port", base_url);
  return e;
}

namespace {

// Runs one asynchronous operation to its end; the stream's expiry bounds it.
template <class Start>
beast::error_code wait(net::io_context& io, Start&& start) {
  beast::error_code result = net::error::would_block;
  start([&result](beast::error_code ec, auto&&...) { result = ec; });
  io.restart();
  io.run();
  return result;
}

}  // namespace

HttpResult http_request(const Endpoint& endpoint, const std::string& target, const std::string& body,
                        const std::string& bearer_token, std::chrono::seconds timeout,
                        const std::function<void(const char*, size_t)>& on_body) {
  HttpResult result;
  net::io_context io;
  tcp::resolver resolver(io);
  tcp::resolver::results_type endpoints;
  beast::error_code ec = wait(io, [&](auto handler) {
    resolver.async_resolve(endpoint.host, endpoint.port,
                           [&endpoints, handler](beast::error_code e, tcp::resolver::results_type r) mutable {
                             endpoints = std::move(r);
                             handler(e);
                           });
  });
  if (ec) return {0, fmt::format("cannot resolve {} ({})", endpoint.host, ec.message())};
  beast::tcp_stream stream(io);
  stream.expires_after(timeout);
  ec = wait(io, [&](auto handler) { stream.async_connect(endpoints, handler); });
  if (ec) return {0, fmt::format("cannot connect to {}:{} ({})", endpoint.host, endpoint.port, ec.message())};

  http::request<http::string_body> request(body.empty() ? http::verb::get : http::verb::post, target, 11);
  request.set(http::field::host, endpoint.host + ":" + endpoint.port);
  request.set(http::field::user_agent, "m3serve-bench-agentic");
  request.set(http::field::connection, "close");
  if (!bearer_token.empty()) request.set(http::field::authorization, "Bearer " + bearer_token);
  if (!body.empty()) {
    request.set(http::field::content_type, "application/json");
    request.body() = body;
    request.prepare_payload();
  }
  stream.expires_after(timeout);
  ec = wait(io, [&](auto handler) { http::async_write(stream, request, handler); });
  if (ec) return {0, fmt::format("sending {} failed ({})", target, ec.message())};

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  stream.expires_after(timeout);
  ec = wait(io, [&](auto handler) { http::async_read_header(stream, buffer, parser, handler); });
  if (ec) return {0, fmt::format("no response to {} ({})", target, ec.message())};
  result.status = static_cast<int>(parser.get().result_int());
  const bool success = result.status >= 200 && result.status < 300;

  std::array<char, 16 * 1024> piece;
  while (!parser.is_done()) {
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    stream.expires_after(timeout);
    // read_some, not read: read waits until the piece is full, which would bunch a stream's
    // chunks together and hide their arrival times.
    ec = wait(io, [&](auto handler) { http::async_read_some(stream, buffer, parser, handler); });
    if (ec == http::error::need_buffer) ec = {};
    const size_t n = piece.size() - parser.get().body().size;
    if (n > 0) {
      if (success) {
        on_body(piece.data(), n);
      } else if (result.error.size() < 2048) {
        result.error.append(piece.data(), n);
      }
    }
    if (ec == http::error::end_of_stream || ec == http::error::partial_message) {
      return {0, fmt::format("{}: the connection closed mid-response", target)};
    }
    if (ec) return {0, fmt::format("{}: reading the response failed ({})", target, ec.message())};
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return result;
}

}  // namespace m3::loadgen
