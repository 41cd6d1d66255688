// CUDA graphs for decode steps (ops/backend.h run_replayable): a cache of graphs recorded from a
// step's run ops, one per step shape, replayed for later steps of that shape.
//
// A shape's first step runs eagerly (it grows every grow-only scratch buffer to the shape), its
// second is recorded with stream capture and launched, later ones only launch. Graphs hold device
// pointers, so any move of scratch memory (the `generation` the backend reports: DeviceBuffer
// moves plus the MSA plan's workspace generation) drops every graph; the model's own tensors are
// covered by ReplayKey::buffers_generation.
#pragma once
#include <cstdint>
#include <functional>
#include <map>

#include <cuda_runtime_api.h>

#include "ops/backend.h"

namespace m3::cuda {

inline constexpr int kMaxGraphPages = 4096;  // page-table width buckets above this run eagerly
inline constexpr int kMaxGraphSeqs = 256;    // larger decode batches run eagerly
inline constexpr int kMaxGraphQueryTokens = 8;  // tokens per sequence of a recorded step (1 + 7 drafts)
inline constexpr int kGraphCacheSize = 64;   // graphs kept (least recently used dropped first)

// The page-table width a decode step of `pages` pages per sequence (at most) is recorded for: the
// next power of two >= max(pages, 16); 0 above kMaxGraphPages (no graph).
int graph_pages_bucket(int pages);

struct GraphKey {
  ReplayKey step;
  int pages_bucket = 0;

  auto operator<=>(const GraphKey&) const = default;
};

class GraphCache {
 public:
  GraphCache(size_t capacity, std::function<int64_t()> generation);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Runs `body` (kernel launches on `stream` only) for a step of shape `key`: eagerly, recorded,
  // or replayed (see above). A body that cannot be recorded (it throws while capturing, e.g. a
  // synchronising call) runs eagerly, and its shape stays eager until the next generation.
  void run(const GraphKey& key, cudaStream_t stream, const std::function<void()>& body);
  void clear();

  struct Stats {
    int64_t eager = 0, captures = 0, replays = 0, capture_failures = 0, drops = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    bool warm = false;        // ran eagerly at this generation
    bool eager_only = false;  // recording failed at this generation
    cudaGraphExec_t exec = nullptr;
    uint64_t last_used = 0;
  };
  void sync_generation(const GraphKey* keep);
  bool capture(const GraphKey& key, Entry& entry, cudaStream_t stream, const std::function<void()>& body);
  void evict_one(const GraphKey& keep);

  size_t capacity_;
  std::function<int64_t()> generation_fn_;
  int64_t generation_ = -1;
  uint64_t tick_ = 0;
  std::map<GraphKey, Entry> entries_;
  Stats stats_;
};

}  // namespace m3::cuda
