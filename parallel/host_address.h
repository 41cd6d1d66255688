// The address other hosts reach this one at: what the Gloo TCP transport of a rank on several
// hosts listens on.
#pragma once
#include <string>

namespace m3 {

// The IPv4 address of this host's interface that routes to host:port (a UDP "connect" picks it;
// no packet is sent). For --master-addr 127.0.0.1 it is 127.0.0.1, so one host runs every node.
// Throws m3::Error naming the host when it does not resolve or no route leads there.
std::string local_address_towards(const std::string& host, int port);

}  // namespace m3
