#include "parallel/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "core/error.h"

namespace m3 {
namespace {

// The wire: a request is an op byte, a u32 key length and the key, and for kSet a u32 value length
// and the value; a reply is one status byte, and for a found kGet the u32 length and the value.
enum : uint8_t { kSet = 1, kGet = 2 };
enum : uint8_t { kMissing = 0, kOk = 1 };
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 16u << 20;  // addresses and ids are bytes to kilobytes

std::string errno_text() { return std::strerror(errno); }

// False when the peer closed the connection before n bytes; throws on other errors.
bool read_all(int fd, void* data, size_t n, const std::string& address) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) fail("rendezvous store at {}: no reply (timed out)", address);
      fail("rendezvous store at {}: receive failed: {}", address, errno_text());
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

void write_all(int fd, const void* data, size_t n, const std::string& address) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      fail("rendezvous store at {}: send failed: {}", address, errno_text());
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
}

void append_u32(std::string& out, uint32_t v) {
  const uint32_t be = htonl(v);
  out.append(reinterpret_cast<const char*>(&be), sizeof(be));
}

uint32_t read_u32(int fd, const std::string& address, bool* ok) {
  uint32_t be = 0;
  *ok = read_all(fd, &be, sizeof(be), address);
  return ntohl(be);
}

// host:port as an IPv4 socket address; the host may be a name.
sockaddr_in resolve(const std::string& host, int port) {
  M3_CHECK(port >= 0 && port < 65536, "rendezvous store at {}:{}: not a TCP port", host, port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  M3_CHECK(rc == 0 && found != nullptr, "rendezvous store at {}:{}: cannot resolve '{}': {}", host, port, host,
           gai_strerror(rc));
  sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Serves one request from a client; false when the client has gone (or sent garbage).
bool serve_request(int fd, std::map<std::string, std::vector<char>>& values, const std::string& address) {
  uint8_t op = 0;
  if (!read_all(fd, &op, 1, address)) return false;
  bool ok = false;
  const uint32_t key_len = read_u32(fd, address, &ok);
  if (!ok || key_len > kMaxKeyBytes || (op != kSet && op != kGet)) return false;
  std::string key(key_len, '\0');
  if (!read_all(fd, key.data(), key_len, address)) return false;
  std::string reply;
  if (op == kSet) {
    const uint32_t value_len = read_u32(fd, address, &ok);
    if (!ok || value_len > kMaxValueBytes) return false;
    std::vector<char> value(value_len);
    if (!read_all(fd, value.data(), value_len, address)) return false;
    values[key] = std::move(value);
    reply.push_back(static_cast<char>(kOk));
  } else {
    const auto it = values.find(key);
    if (it == values.end()) {
      reply.push_back(static_cast<char>(kMissing));
    } else {
      reply.push_back(static_cast<char>(kOk));
      append_u32(reply, static_cast<uint32_t>(it->second.size()));
      reply.append(it->second.data(), it->second.size());
    }
  }
  write_all(fd, reply.data(), reply.size(), address);
  return true;
}

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  address_ = fmt::format("{}:{}", host, port);
  const sockaddr_in addr = resolve(host, port);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  M3_CHECK(listen_fd_ >= 0, "rendezvous store: cannot open a socket for {}: {}", address_, errno_text());
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    const std::string why = errno_text();
    ::close(listen_fd_);
    fail("rendezvous store: cannot listen on {} (--master-addr / --master-port): {}", address_, why);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
  address_ = fmt::format("{}:{}", host, port_);
  if (::pipe2(wake_fds_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    fail("rendezvous store at {}: pipe: {}", address_, errno_text());
  }
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  const char stop = 1;
  (void)!::write(wake_fds_[1], &stop, 1);
  if (thread_.joinable()) thread_.join();
  ::close(wake_fds_[0]);
  ::close(wake_fds_[1]);
  ::close(listen_fd_);
}

void TcpStoreServer::serve() {
  std::map<std::string, std::vector<char>> values;
  std::vector<int> clients;
  for (;;) {
    std::vector<pollfd> fds{{wake_fds_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (int c : clients) fds.push_back({c, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;  // nothing to report to: the clients see their connection close
    }
    if (fds[0].revents != 0) break;
    std::vector<int> kept;
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        // A request is a few bytes sent at once: a client stuck halfway must not stall the others.
        timeval tv{5, 0};
        ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        kept.push_back(c);
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      bool alive = true;
      if (fds[i].revents != 0) {
        try {
          alive = serve_request(fds[i].fd, values, address_);
        } catch (const Error&) {
          alive = false;  // a client that broke its connection; the others carry on
        }
      }
      if (alive) kept.push_back(fds[i].fd);
      else ::close(fds[i].fd);
    }
    clients = std::move(kept);
  }
  for (int c : clients) ::close(c);
}

std::shared_ptr<TcpStore> TcpStore::connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string address = fmt::format("{}:{}", host, port);
  const sockaddr_in addr = resolve(host, port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    M3_CHECK(fd >= 0, "rendezvous store at {}: cannot open a socket: {}", address, errno_text());
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      // A server that stops answering must not hang a client forever.
      const auto ms = std::max<int64_t>(timeout.count(), 1000);
      timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      return std::shared_ptr<TcpStore>(new TcpStore(fd, address, timeout));
    }
    const std::string why = errno_text();
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline)
      fail("rendezvous store at {} (--master-addr / --master-port): nothing answered within {} ms: {}", address,
           timeout.count(), why);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpStore::~TcpStore() { ::close(fd_); }

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  M3_CHECK(key.size() <= kMaxKeyBytes && value.size() <= kMaxValueBytes,
           "rendezvous store at {}: key '{}' or its {}-byte value is too large", address_, key, value.size());
  std::string request(1, static_cast<char>(kSet));
  append_u32(request, static_cast<uint32_t>(key.size()));
  request += key;
  append_u32(request, static_cast<uint32_t>(value.size()));
  request.append(value.data(), value.size());
  std::lock_guard lock(mutex_);
  write_all(fd_, request.data(), request.size(), address_);
  uint8_t status = 0;
  M3_CHECK(read_all(fd_, &status, 1, address_) && status == kOk,
           "rendezvous store at {}: the server closed the connection while setting '{}'", address_, key);
}

bool TcpStore::try_get(const std::string& key, std::vector<char>* value) {
  M3_CHECK(key.size() <= kMaxKeyBytes, "rendezvous store at {}: key of {} bytes is too long", address_, key.size());
  std::string request(1, static_cast<char>(kGet));
  append_u32(request, static_cast<uint32_t>(key.size()));
  request += key;
  std::lock_guard lock(mutex_);
  write_all(fd_, request.data(), request.size(), address_);
  uint8_t status = 0;
  bool ok = read_all(fd_, &status, 1, address_);
  M3_CHECK(ok, "rendezvous store at {}: the server closed the connection while reading '{}' (node 0 gone?)",
           address_, key);
  if (status != kOk) return false;
  const uint32_t len = read_u32(fd_, address_, &ok);
  std::vector<char> got(ok ? len : 0);
  ok = ok && read_all(fd_, got.data(), got.size(), address_);
  M3_CHECK(ok, "rendezvous store at {}: the server closed the connection while reading '{}'", address_, key);
  if (value) *value = std::move(got);
  return true;
}

bool TcpStore::contains(const std::string& key) { return try_get(key, nullptr); }

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> missing = keys;
  for (;;) {
    std::vector<std::string> still;
    for (const std::string& k : missing)
      if (!contains(k)) still.push_back(k);
    if (still.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string names;
      for (const std::string& k : still) names += (names.empty() ? "'" : ", '") + k + "'";
      fail("rendezvous store at {}: {} not set within {} ms (a process of the deployment missing or late?)",
           address_, names, timeout.count());
    }
    missing = std::move(still);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> value;
  M3_CHECK(try_get(key, &value), "rendezvous store at {}: '{}' vanished", address_, key);
  return value;
}

}  // namespace m3
