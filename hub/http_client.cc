#include "hub/http_client.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <limits>

namespace m3::hub {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr std::size_t kErrorBodyBytes = 4096;
constexpr std::size_t kHeaderLimit = 64 * 1024;

bool iequals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

}  // namespace

Url Url::parse(const std::string& text) {
  Url url;
  const std::size_t colon = text.find("://");
  M3_CHECK(colon != std::string::npos, "'{}' is not a URL (expected http://host/... or https://host/...)", text);
  url.scheme = text.substr(0, colon);
  for (char& c : url.scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  M3_CHECK(url.scheme == "http" || url.scheme == "https", "'{}': only http and https URLs are supported", text);
  const std::size_t host_begin = colon + 3;
  const std::size_t path_begin = text.find_first_of("/?", host_begin);
  const std::string authority = text.substr(host_begin, path_begin == std::string::npos ? std::string::npos
                                                                                         : path_begin - host_begin);
  M3_CHECK(authority.find('@') == std::string::npos, "'{}': user information in URLs is not supported", text);
  const std::size_t port_colon = authority.rfind(':');
  url.host = authority.substr(0, port_colon);
  url.port = port_colon == std::string::npos ? (url.scheme == "https" ? "443" : "80") : authority.substr(port_colon + 1);
  M3_CHECK(!url.host.empty(), "'{}': no host", text);
  M3_CHECK(!url.port.empty() && std::all_of(url.port.begin(), url.port.end(), ::isdigit), "'{}': bad port", text);
  url.target = path_begin == std::string::npos ? "/" : text.substr(path_begin);
  if (url.target.front() == '?') url.target.insert(url.target.begin(), '/');
  return url;
}

Url Url::resolve(const std::string& location) const {
  if (location.find("://") != std::string::npos) return parse(location);
  Url next = *this;
  if (location.rfind("//", 0) == 0) return parse(scheme + ":" + location);
  if (!location.empty() && location.front() == '/') {
    next.target = location;
  } else {
    const std::string path = target.substr(0, target.find('?'));
    next.target = path.substr(0, path.rfind('/') + 1) + location;
  }
  return next;
}

std::string Url::str() const {
  const bool default_port = (scheme == "https" && port == "443") || (scheme == "http" && port == "80");
  return scheme + "://" + host + (default_port ? "" : ":" + port) + target;
}

std::optional<std::string> HttpResponse::header(const std::string& name) const {
  for (const HttpHeader& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return std::nullopt;
}

struct HttpClient::Impl {
  net::io_context io;
  net::ssl::context tls{net::ssl::context::tls_client};

  Impl() {
    tls.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                    net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
    // The system's trusted certificates (Debian: /etc/ssl/certs), as curl and Python's ssl use.
    tls.set_default_verify_paths();
    tls.set_verify_mode(net::ssl::verify_peer);
  }

  // Runs one asynchronous operation to its end on this thread; the stream's expiry (set by the
  // caller) bounds how long it may take.
  template <class Start>
  beast::error_code wait(Start&& start) {
    beast::error_code result = net::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    io.restart();
    io.run();
    return result;
  }

  // One request on a fresh connection; returns the response head (after calling on_head and
  // streaming the body when the status is not a redirect).
  HttpResponse fetch(const Url& url, const std::vector<HttpHeader>& headers, std::chrono::seconds timeout,
                     const HeadCallback& on_head, const BodyCallback& on_body) {
    const std::string where = url.str();
    tcp::resolver resolver(io);
    tcp::resolver::results_type endpoints;
    beast::error_code ec = wait([&](auto handler) {
      resolver.async_resolve(url.host, url.port,
                             [&endpoints, handler](beast::error_code e, tcp::resolver::results_type r) mutable {
                               endpoints = std::move(r);
                               handler(e);
                             });
    });
    if (ec) throw NetworkError(fmt::format("{}: cannot resolve host '{}' ({})", where, url.host, ec.message()));
    if (url.scheme == "https") {
      beast::ssl_stream<beast::tcp_stream> stream(io, tls);
      // SNI, and the certificate must name this host.
      if (!SSL_set_tlsext_host_name(stream.native_handle(), url.host.c_str())) {
        throw NetworkError(fmt::format("{}: cannot set the TLS server name '{}'", where, url.host));
      }
      stream.set_verify_callback(net::ssl::host_name_verification(url.host));
      connect(beast::get_lowest_layer(stream), endpoints, timeout, where);
      beast::get_lowest_layer(stream).expires_after(timeout);
      ec = wait([&](auto handler) { stream.async_handshake(net::ssl::stream_base::client, handler); });
      if (ec) {
        throw NetworkError(fmt::format("{}: TLS handshake failed ({}); server certificates are checked against the "
                                       "system store (SSL_CERT_FILE / SSL_CERT_DIR select another)",
                                       where, ec.message()));
      }
      return exchange(stream, beast::get_lowest_layer(stream), url, headers, timeout, on_head, on_body);
    }
    beast::tcp_stream stream(io);
    connect(stream, endpoints, timeout, where);
    return exchange(stream, stream, url, headers, timeout, on_head, on_body);
  }

  void connect(beast::tcp_stream& stream, const tcp::resolver::results_type& endpoints, std::chrono::seconds timeout,
               const std::string& where) {
    stream.expires_after(timeout);
    const beast::error_code ec = wait([&](auto handler) { stream.async_connect(endpoints, handler); });
    if (ec) throw NetworkError(fmt::format("{}: cannot connect ({})", where, ec.message()));
  }

  template <class Stream>
  HttpResponse exchange(Stream& stream, beast::tcp_stream& tcp_layer, const Url& url,
                        const std::vector<HttpHeader>& headers, std::chrono::seconds timeout,
                        const HeadCallback& on_head, const BodyCallback& on_body) {
    const std::string where = url.str();
    http::request<http::empty_body> request(http::verb::get, url.target, 11);
    request.set(http::field::host, url.host);
    request.set(http::field::user_agent, "m3serve");
    request.set(http::field::accept_encoding, "identity");  // sizes and hashes are of the stored bytes
    request.set(http::field::connection, "close");
    for (const HttpHeader& h : headers) request.set(h.name, h.value);
    tcp_layer.expires_after(timeout);
    beast::error_code ec = wait([&](auto handler) { http::async_write(stream, request, handler); });
    if (ec) throw NetworkError(fmt::format("{}: sending the request failed ({})", where, ec.message()));

    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.header_limit(kHeaderLimit);
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    tcp_layer.expires_after(timeout);
    ec = wait([&](auto handler) { http::async_read_header(stream, buffer, parser, handler); });
    if (ec) throw NetworkError(fmt::format("{}: no response ({})", where, ec.message()));

    HttpResponse response;
    response.status = static_cast<int>(parser.get().result_int());
    response.url = where;
    for (const auto& field : parser.get()) {
      response.headers.push_back({std::string(field.name_string()), std::string(field.value())});
    }
    if (is_redirect(response.status)) return response;  // the connection closes unread
    if (on_head) on_head(response);
    const bool success = response.status >= 200 && response.status < 300;

    std::array<char, 64 * 1024> piece;
    uint64_t received = 0;
    while (!parser.is_done()) {
      parser.get().body().data = piece.data();
      parser.get().body().size = piece.size();
      tcp_layer.expires_after(timeout);
      ec = wait([&](auto handler) { http::async_read(stream, buffer, parser, handler); });
      if (ec == http::error::need_buffer) ec = {};
      const std::size_t n = piece.size() - parser.get().body().size;
      received += n;
      if (n > 0) {
        if (success) {
          if (on_body) on_body(piece.data(), n);
        } else if (response.error_body.size() < kErrorBodyBytes) {
          response.error_body.append(piece.data(), std::min(n, kErrorBodyBytes - response.error_body.size()));
        }
      }
      if (ec) {
        throw NetworkError(fmt::format("{}: the connection broke after {} bytes of the response body ({})", where,
                                       received, ec.message()));
      }
    }
    return response;
  }
};

HttpClient::HttpClient() : impl_(std::make_unique<Impl>()) {}
HttpClient::~HttpClient() = default;

HttpResponse HttpClient::get(const std::string& url_text, const HttpGetOptions& options, const HeadCallback& on_head,
                             const BodyCallback& on_body) {
  const Url first = Url::parse(url_text);
  Url url = first;
  for (int hop = 0;; ++hop) {
    std::vector<HttpHeader> headers = options.headers;
    if (url.host == first.host && url.port == first.port && url.scheme == first.scheme) {
      headers.insert(headers.end(), options.same_host_headers.begin(), options.same_host_headers.end());
    }
    HttpResponse response = impl_->fetch(url, headers, options.timeout, on_head, on_body);
    if (!is_redirect(response.status)) return response;
    const std::optional<std::string> location = response.header("Location");
    if (!location) return response;  // a redirect that says nowhere: the caller sees its status
    if (hop >= options.max_redirects) {
      throw NetworkError(
          fmt::format("{}: more than {} redirects (the last to {})", url_text, options.max_redirects, *location));
    }
    url = url.resolve(*location);
  }
}

}  // namespace m3::hub
