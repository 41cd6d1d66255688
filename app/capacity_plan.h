// The memory plan of a deployment: for each rank of a parallel layout, its weights (from
// config.json and quantization_config, model/weight_footprint.h), the bytes one token of KV and
// index-K takes there (the pool layout itself, kv_layout_for), the activation reserve, and so
// how many sequences of max-model-len tokens fit in what --gpu-memory-utilization leaves.
// `m3serve plan` prints it; the loader logs the same figures for the one-device layout it runs.
//
// Assumptions (docs/architecture.md "Capacity plan"):
//  - A GPU's usable memory is --gpu-memory-utilization x its memory (GB = 1e9 bytes), as vLLM.
//  - Out of that come the rank's weights, then the activation reserve (gpu_activation_reserve_bytes,
//    the same the loader keeps out of the KV pool: 1 GiB for the CUDA context, cuBLASLt workspace
//    and MSA schedules, plus the step's activations and logits at the engine options), computed
//    for the whole model's widths, not the rank's share (an upper bound under -tp). Under
//    data-parallel attention a rank's MoE runs over every copy's rows, so its routed-expert
//    activations count D x the step's tokens, plus the gathered and returned rows.
//  - What is left is KV blocks of the rank's own layout (its KV heads, the whole index-K); a
//    sequence of max-model-len tokens takes ceil(len / block) blocks, and a data-parallel copy
//    holds the sequences its tp ranks all have room for. Copies add up.
#pragma once
#include <cstdint>

#include "model/config.h"
#include "model/weight_footprint.h"
#include "ops/kv_layout.h"
#include "parallel/layout.h"

namespace m3::app {

// GPU memory one rank's step takes beyond the weights and the KV pool (see above).
int64_t gpu_activation_reserve_bytes(const ModelConfig& config, const ParallelLayout& layout, int max_num_batched_tokens,
                                     int max_num_seqs);

// One token's bytes in a KV layout, split as K+V (all layers, the layout's KV heads) and index-K
// (sparse layers); total is the layout's own (it pads each layer's slab to 256 bytes per block).
struct KvTokenBytes {
  int64_t kv = 0;
  int64_t index_k = 0;
  int64_t total = 0;
};
KvTokenBytes kv_token_bytes(const KvLayout& layout);

struct CapacityRequest {
  ParallelConfig parallel;
  KvDType kv_dtype = KvDType::kBF16;
  KvDType index_dtype = KvDType::kBF16;
  int64_t max_model_len = 0;
  int64_t gpu_memory_bytes = 0;  // per GPU
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
};

struct CapacityPlan {
  ParallelLayout layout;
  WeightFootprint weights;  // of the heaviest rank
  KvLayout kv_layout;       // of one rank (every rank holds the same number of KV heads)
  KvTokenBytes token_bytes;
  int64_t activation_reserve_bytes = 0;
  int64_t budget_bytes = 0;   // utilization x GPU memory
  int64_t kv_pool_bytes = 0;  // budget - weights - reserve (0 when nothing is left)
  int64_t kv_blocks = 0;      // per rank
  int64_t blocks_per_sequence = 0;
  int64_t sequences_per_copy = 0;  // per data-parallel copy
  int64_t max_concurrent_sequences = 0;  // over all copies
};

// Throws m3::Error naming the option for layouts that do not fit the model (parallel/layout.h).
CapacityPlan plan_capacity(const ModelConfig& config, const CapacityRequest& request);

}  // namespace m3::app
