// The Gloo implementation of parallel/communicator.h: host tensors, blocking collectives over
// Gloo's TCP transport. The CPU backend runs its tensor / expert parallel layouts on it, so CI
// tests the same parallel code the GPUs run over NCCL.
//
// Ranks meet through a rendezvous store: in one process (`--device cpu -tp N`: a thread per rank)
// an in-memory store, across hosts (--nnodes) the TCP store at --master-addr (parallel/tcp_store.h);
// the ranks then connect to each other directly over TCP, each listening on GlooOptions::hostname.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace m3 {

class TcpStore;

// Where the ranks of a group exchange addresses; a value shared by the ranks' threads.
struct GlooRendezvous {
  // For the ranks of one process (an in-memory store).
  static GlooRendezvous in_process();
  // For ranks in several processes: the TCP store every process has connected to. Gloo waits
  // for its peers' addresses there for GlooOptions::timeout.
  static GlooRendezvous tcp(std::shared_ptr<TcpStore> store);

  struct Store;  // gloo's store, kept out of this header
  std::shared_ptr<Store> store;
};

struct GlooOptions {
  // The address this rank listens on: loopback in one process, across hosts one the other hosts
  // reach (parallel/host_address.h).
  std::string hostname = "127.0.0.1";
  // How long a collective waits for its peers before it throws (a rank that died or hangs).
  std::chrono::milliseconds timeout{120'000};
};

// Joins group `group_name` as `rank` of `size`. Every rank calls it concurrently (it returns when
// all have joined) from its own thread. Throws m3::Error naming the group on failure.
std::unique_ptr<Communicator> connect_gloo(GlooRendezvous& rendezvous, int rank, int size, std::string group_name,
                                           const GlooOptions& options = {});

}  // namespace m3
