// A deployment's parallelism as the user gives it (vLLM's option names). Plain data; the layout
// (parallel/layout.h) checks it against a model.
#pragma once

namespace m3 {

struct ParallelConfig {
  int tensor_parallel_size = 1;  // -tp: ranks that split one copy of the attention and dense weights
  int data_parallel_size = 1;    // --data-parallel-size: copies, each scheduling its own requests
  // --enable-expert-parallel: routed experts spread whole over all tp x dp ranks instead of each
  // expert's intermediate split over the tp ranks of every copy.
  bool enable_expert_parallel = false;

  int world_size() const { return tensor_parallel_size * data_parallel_size; }
};

// Sizes below 1: m3::Error naming the option. Needs no model (serve checks it before any file).
void check_parallel_config(const ParallelConfig& config);

}  // namespace m3
