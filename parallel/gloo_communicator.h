// The Gloo implementation of parallel/communicator.h: host tensors, blocking collectives over
// Gloo's TCP transport. The CPU backend runs its tensor / expert parallel layouts on it, so CI
// tests the same parallel code the GPUs run over NCCL.
//
// Ranks meet through a rendezvous store: in one process (`--device cpu -tp N`: a thread per rank)
// an in-memory store; the ranks then connect to each other over loopback TCP.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace m3 {

// Where the ranks of a group exchange addresses; a value shared by the ranks' threads.
struct GlooRendezvous {
  // For the ranks of one process (an in-memory store).
  static GlooRendezvous in_process();

  struct Store;  // gloo's store, kept out of this header
  std::shared_ptr<Store> store;
};

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // the address this rank listens on
  // How long a collective waits for its peers before it throws (a rank that died or hangs).
  std::chrono::milliseconds timeout{120'000};
};

// Joins group `group_name` as `rank` of `size`. Every rank calls it concurrently (it returns when
// all have joined) from its own thread. Throws m3::Error naming the group on failure.
std::unique_ptr<Communicator> connect_gloo(GlooRendezvous& rendezvous, int rank, int size, std::string group_name,
                                           const GlooOptions& options = {});

}  // namespace m3
