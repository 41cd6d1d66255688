// The kernels a GPU ran, each with its start and end as the GPU's own timestamps, from CUPTI's
// activity API: also the kernel nodes of a replayed CUDA graph, which no host timer separates and
// which Nsight Compute times one at a time, alone, with cold caches and without programmatic
// dependent launch. bench latency's --kernel-timeline records one decode step (and one prefill
// prompt) with it, so that the gaps (a kernel waiting on the one before it, or on a side stream)
// can be read off.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::app {

struct KernelSpan {
  std::string name;  // demangled, without the parameter list
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t stream = 0;
  uint64_t graph_node = 0;  // 0 outside a graph
};

// CUPTI's kernel records are on from construction to destruction (a graph's kernel nodes are
// traced only when CUPTI was on before the graph was built, so the bench turns it on before its
// first step). One at a time per process: CUPTI's activity buffers are process-wide.
class KernelTimeline {
 public:
  // Throws m3::Error when the build has no CUPTI, CUPTI refuses, or a timeline is already on.
  KernelTimeline();
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  // CUPTI's clock, the one its records use.
  uint64_t now() const;
  // The kernels that started in [begin, end), by start; flushes CUPTI's buffers (call it after
  // the work finished).
  std::vector<KernelSpan> spans(uint64_t begin, uint64_t end);
};

}  // namespace m3::app
