#include "app/capacity_plan.h"

#include <algorithm>

#include "core/error.h"
#include "model/minimax_m3.h"

namespace m3::app {

int64_t gpu_activation_reserve_bytes(const ModelConfig& c, const ParallelLayout& layout, int max_tokens,
                                     int max_seqs) {
  // bf16 per token: residual, norms, q/k/v, index-Q, attention output, dense MLP or shared expert;
  // per routed row (the step's tokens, every copy's under DEP): the permuted rows and expert
  // activations of its top-k choices and its fp32 router logits; under DEP the copies' gathered
  // and returned rows and this copy's own (model/minimax_m3.cc ensure_dep_buffers); per logits
  // row bf16 + an f32 staging copy; a fixed 1 GiB margin.
  const int64_t hidden = c.hidden_size;
  const int64_t index = c.has_sparse_layers() ? int64_t(c.index_heads + 1) * c.index_head_dim : 0;
  const int64_t mlp = std::max<int64_t>(c.dense_intermediate_size, c.shared_intermediate_size + hidden);
  const int64_t per_token = 2 * (4 * hidden + 2 * int64_t(c.num_heads) * c.head_dim +
                                 2 * int64_t(c.num_kv_heads) * c.head_dim + index + mlp);
  const int64_t per_routed_row =
      2 * (int64_t(c.experts_per_token) * (c.moe_intermediate_size + hidden) + 2 * int64_t(c.num_experts));
  const int64_t copies = layout.attention_data_parallel() ? layout.config.data_parallel_size : 1;
  const int64_t routed_rows = c.num_moe_layers() > 0 ? copies * max_tokens : 0;
  const int64_t dep_rows = copies > 1 ? (2 * copies + 1) * int64_t(max_tokens) : 0;
  const int64_t per_row = int64_t(c.vocab_size) * (2 + 4) + 2 * hidden;
  return (int64_t{1} << 30) + per_token * max_tokens + per_routed_row * routed_rows + 2 * hidden * dep_rows +
         per_row * max_seqs;
}

KvTokenBytes kv_token_bytes(const KvLayout& l) {
  KvTokenBytes t;
  const int64_t kv_row = kv_data_bytes(l.kv_dtype, l.head_dim) + kv_scale_bytes(l.kv_dtype, l.head_dim);
  const int64_t index_row = kv_data_bytes(l.index_dtype, l.index_dim) + kv_scale_bytes(l.index_dtype, l.index_dim);
  for (int i = 0; i < l.num_layers; ++i) {
    t.kv += 2 * int64_t(l.num_kv_heads) * kv_row;
    if (l.layer_has_index[i]) t.index_k += index_row;
  }
  t.total = l.bytes_per_token();
  return t;
}

CapacityPlan plan_capacity(const ModelConfig& c, const CapacityRequest& r) {
  M3_CHECK(r.gpu_memory_bytes > 0, "--gpu-memory-gb must be positive");
  M3_CHECK(r.gpu_memory_utilization > 0 && r.gpu_memory_utilization <= 1,
           "--gpu-memory-utilization must be in (0, 1], got {}", r.gpu_memory_utilization);
  M3_CHECK(r.max_model_len > 0, "--max-model-len must be positive, got {}", r.max_model_len);
  CapacityPlan p;
  p.layout = make_parallel_layout(r.parallel, model_geometry(c));
  for (const RankShard& shard : p.layout.ranks) {
    const WeightFootprint f = weight_footprint(c, shard);
    if (f.total() > p.weights.total()) p.weights = f;
  }
  p.kv_layout = kv_layout_for(c, r.kv_dtype, r.index_dtype, static_cast<int>(p.layout.ranks.front().kv_heads.size));
  p.token_bytes = kv_token_bytes(p.kv_layout);
  p.activation_reserve_bytes = gpu_activation_reserve_bytes(c, p.layout, r.max_num_batched_tokens, r.max_num_seqs);
  p.budget_bytes = static_cast<int64_t>(r.gpu_memory_utilization * static_cast<double>(r.gpu_memory_bytes));
  p.kv_pool_bytes = std::max<int64_t>(0, p.budget_bytes - p.weights.total() - p.activation_reserve_bytes);
  p.kv_blocks = p.kv_pool_bytes / p.kv_layout.block_bytes;
  p.blocks_per_sequence = (r.max_model_len + p.kv_layout.block_size - 1) / p.kv_layout.block_size;
  // Every rank holds as many KV heads, and the heaviest rank's weights bound them all, so a copy
  // fits what one rank fits; copies schedule disjoint requests, so their sequences add up.
  p.sequences_per_copy = p.kv_blocks / p.blocks_per_sequence;
  p.max_concurrent_sequences = p.sequences_per_copy * r.parallel.data_parallel_size;
  return p;
}

}  // namespace m3::app
