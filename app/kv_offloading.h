// --kv-offloading-size GiB and --kv-offloading-backend (vLLM's options): the host tier of the
// prefix cache (engine/kv_manager.h). The size is the whole tier, every rank's share together
// (as vLLM's, summed over the ranks); each rank holds the same number of slots of its own share
// of a block, and data-parallel lanes split the slots evenly. Only vLLM's "native" backend exists.
#pragma once
#include <cstdint>
#include <string>

namespace m3::app {

// The option's text -> bytes. Throws m3::Error naming the option for anything but a positive
// number of GiB (fractions allowed).
int64_t parse_kv_offloading_size(const std::string& text);
// --kv-offloading-backend: "native" is accepted; anything else is an m3::Error naming it.
void check_kv_offloading_backend(const std::string& name);
// Memory this host can still give (MemAvailable of /proc/meminfo), or -1 when unknown.
int64_t host_available_bytes();
// Host slots per rank for a tier of `bytes` over `ranks` ranks that each hold `block_bytes` of a
// block; throws m3::Error naming the option when that is not one block, or when this host's part
// (its `local_ranks` ranks' slots) is more than it has available.
int64_t kv_offload_slots(const std::string& size_text, int64_t block_bytes, int ranks, int local_ranks);

}  // namespace m3::app
