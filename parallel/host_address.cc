#include "parallel/host_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace m3 {

std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  M3_CHECK(rc == 0 && found != nullptr, "--master-addr {}: cannot resolve it: {}", host, gai_strerror(rc));
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    const std::string why = std::strerror(errno);
    ::freeaddrinfo(found);
    if (fd >= 0) ::close(fd);
    fail("--master-addr {}: no route from this host to it: {}", host, why);
  }
  ::freeaddrinfo(found);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const int got = ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len);
  ::close(fd);
  M3_CHECK(got == 0, "--master-addr {}: cannot read this host's address towards it", host);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return text;
}

}  // namespace m3
