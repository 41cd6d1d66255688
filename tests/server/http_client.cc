#include "tests/server/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <stdexcept>

namespace m3::testing {
namespace {

int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("connect() to the test server failed");
  }
  return fd;
}

void send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (e.g. 413); the reply is still readable
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Reads whatever arrives within the deadline; false when the peer closed.
bool read_some(int fd, std::string& out, std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
  char buffer[16384];
  ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
  if (n <= 0) return false;
  out.append(buffer, static_cast<size_t>(n));
  return true;
}

std::string dechunk(std::string_view body) {
  std::string out;
  while (!body.empty()) {
    size_t line_end = body.find("\r\n");
    if (line_end == std::string_view::npos) break;
    size_t size = std::stoul(std::string(body.substr(0, line_end)), nullptr, 16);
    body.remove_prefix(line_end + 2);
    if (size == 0) break;
    out.append(body.substr(0, size));
    body.remove_prefix(std::min(body.size(), size + 2));
  }
  return out;
}

HttpReply parse_reply(const std::string& raw) {
  HttpReply reply;
  size_t header_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || header_end == std::string::npos) return reply;
  reply.status = std::stoi(raw.substr(9, 3));
  size_t pos = raw.find("\r\n") + 2;
  while (pos < header_end) {
    size_t end = raw.find("\r\n", pos);
    std::string line = raw.substr(pos, end - pos);
    size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t value_start = line.find_first_not_of(' ', colon + 1);
      reply.headers[name] = value_start == std::string::npos ? "" : line.substr(value_start);
    }
    pos = end + 2;
  }
  std::string body = raw.substr(header_end + 4);
  auto te = reply.headers.find("transfer-encoding");
  reply.body = (te != reply.headers.end() && te->second == "chunked") ? dechunk(body) : body;
  return reply;
}

std::string format_request(std::string_view method, std::string_view path, std::string_view body,
                           const std::map<std::string, std::string>& headers) {
  std::string raw =
      std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    raw += name + ": " + value + "\r\n";
    has_type = has_type || name == "Content-Type";
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) raw += "Content-Type: application/json\r\n";
    raw += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  raw += "Connection: close\r\n\r\n";
  raw += body;
  return raw;
}

}  // namespace

HttpReply send_raw(int port, std::string_view raw, int timeout_ms) {
  int fd = connect_loopback(port);
  send_all(fd, raw);
  std::string received;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (read_some(fd, received, deadline)) {
  }
  ::close(fd);
  return parse_reply(received);
}

HttpReply http_request(int port, std::string_view method, std::string_view path,
                       std::string_view body, const std::map<std::string, std::string>& headers,
                       int timeout_ms) {
  return send_raw(port, format_request(method, path, body, headers), timeout_ms);
}

OpenRequest::OpenRequest(int port, std::string_view method, std::string_view path,
                         std::string_view body)
    : fd_(connect_loopback(port)) {
  send_all(fd_, format_request(method, path, body, {}));
}

OpenRequest::~OpenRequest() { close(); }

std::string OpenRequest::read_until(std::string_view needle, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (received_.find(needle) == std::string::npos && read_some(fd_, received_, deadline)) {
  }
  return received_;
}

void OpenRequest::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace m3::testing
