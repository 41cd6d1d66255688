// GraphCache: eager warm-up, stream capture, replay (cuda_graphs.h).
#include "kernels/cuda/backend/cuda_graphs.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/log.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3::cuda {
namespace {

void destroy(cudaGraphExec_t& exec) {
  if (exec) cudaGraphExecDestroy(exec);
  exec = nullptr;
}

std::string key_string(const GraphKey& k) {
  return fmt::format("{} tokens, {} seqs, {} logit rows, {} pages", k.step.num_tokens, k.step.num_seqs,
                     k.step.logit_rows, k.pages_bucket);
}

}  // namespace

int graph_pages_bucket(int pages) {
  int bucket = 16;
  while (bucket < pages) bucket *= 2;
  return bucket <= kMaxGraphPages ? bucket : 0;
}

GraphCache::GraphCache(size_t capacity, std::function<int64_t()> generation)
    : capacity_(std::max<size_t>(capacity, 1)), generation_fn_(std::move(generation)) {}

GraphCache::~GraphCache() { clear(); }

void GraphCache::clear() {
  for (auto& [key, entry] : entries_) destroy(entry.exec);
  entries_.clear();
}

// Scratch moved since the graphs were recorded: they may point at freed memory. Drop them all
// (the entry of `keep`, which just ran eagerly at the new generation, stays warm).
void GraphCache::sync_generation(const GraphKey* keep) {
  const int64_t now = generation_fn_();
  if (now == generation_) return;
  generation_ = now;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (keep && it->first == *keep) {
      destroy(it->second.exec);
      it->second.eager_only = false;
      ++it;
      continue;
    }
    if (it->second.exec) ++stats_.drops;
    destroy(it->second.exec);
    it = entries_.erase(it);
  }
}

void GraphCache::evict_one(const GraphKey& keep) {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (!(it->first == keep) && (victim == entries_.end() || it->second.last_used < victim->second.last_used))
      victim = it;
  if (victim == entries_.end()) return;
  destroy(victim->second.exec);
  entries_.erase(victim);
}

void GraphCache::run(const GraphKey& key, cudaStream_t stream, const std::function<void()>& body) {
  sync_generation(nullptr);
  Entry& entry = entries_[key];
  entry.last_used = ++tick_;
  if (entries_.size() > capacity_) evict_one(key);
  if (entry.exec) {
    check_cuda(cudaGraphLaunch(entry.exec, stream), "CUDA graph launch");
    ++stats_.replays;
    return;
  }
  if (!entry.warm || entry.eager_only) {
    body();
    ++stats_.eager;
    entry.warm = true;
    sync_generation(&key);
    return;
  }
  if (!capture(key, entry, stream, body)) {
    entry.eager_only = true;
    ++stats_.capture_failures;
    body();
    ++stats_.eager;
    return;
  }
  ++stats_.captures;
  check_cuda(cudaGraphLaunch(entry.exec, stream), "CUDA graph launch");
}

// Records body into entry.exec; false (nothing recorded, nothing ran) when it cannot be.
bool GraphCache::capture(const GraphKey& key, Entry& entry, cudaStream_t stream, const std::function<void()>& body) {
  // Thread-local mode: a synchronising or allocating call made by the body on this thread fails the
  // capture instead of silently escaping the graph.
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "CUDA graph capture");
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (failure.empty() && end != cudaSuccess) failure = cudaGetErrorString(end);
  if (failure.empty() && generation_fn_() != generation_) failure = "scratch memory moved while recording";
  if (failure.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(&entry.exec, graph, 0);
    if (inst != cudaSuccess) {
      failure = cudaGetErrorString(inst);
      entry.exec = nullptr;
    }
  }
  if (graph) cudaGraphDestroy(graph);
  if (failure.empty()) {
    M3_LOG_DEBUG("cuda graph recorded: {}", key_string(key));
    return true;
  }
  cudaGetLastError();  // a failed capture leaves its error behind; the eager run must not see it
  M3_LOG_WARN("cuda graphs: recording the step ({}) failed: {}; this shape runs eagerly", key_string(key), failure);
  return false;
}

}  // namespace m3::cuda
