#include "parallel/layout.h"

#include <string>

#include <fmt/core.h>

#include "core/error.h"

namespace m3 {

void check_parallel_config(const ParallelConfig& c) {
  M3_CHECK(c.tensor_parallel_size >= 1, "-tp/--tensor-parallel-size must be >= 1, got {}", c.tensor_parallel_size);
  M3_CHECK(c.data_parallel_size >= 1, "--data-parallel-size must be >= 1, got {}", c.data_parallel_size);
}

namespace {

// Part `index` of `total` split in `parts` equal pieces (the caller checked divisibility).
Slice even_part(int64_t total, int parts, int index) {
  const int64_t size = total / parts;
  return {size * index, size};
}

// "-tp 3", or under DEP "-tp 3 (the ranks of each of the --data-parallel-size 2 copies)": the
// option a size that does not divide names, and which ranks split it.
std::string tp_option(const ParallelConfig& c) {
  if (c.data_parallel_size == 1) return fmt::format("-tp {}", c.tensor_parallel_size);
  return fmt::format("-tp {} (the ranks of each of the --data-parallel-size {} copies)", c.tensor_parallel_size,
                     c.data_parallel_size);
}

// A dimension split over the tp ranks of a copy must divide evenly: an uneven split would give
// ranks different GEMM shapes and different collective sizes for no gain.
void check_tp_divides(const ParallelConfig& c, int64_t size, const char* field) {
  const int tp = c.tensor_parallel_size;
  M3_CHECK(size % tp == 0, "{}: {} {} is not a multiple of {}", tp_option(c), field, size, tp);
}

void check_geometry(const ModelGeometry& g) {
  M3_CHECK(g.num_heads > 0 && g.num_kv_heads > 0 && g.head_dim > 0 && g.vocab_size > 0,
           "model geometry: num_attention_heads {}, num_key_value_heads {}, head_dim {} and vocab_size {} must "
           "all be positive",
           g.num_heads, g.num_kv_heads, g.head_dim, g.vocab_size);
  M3_CHECK(g.num_heads % g.num_kv_heads == 0, "num_attention_heads {} is not a multiple of num_key_value_heads {}",
           g.num_heads, g.num_kv_heads);
}

}  // namespace

ParallelLayout make_parallel_layout(const ParallelConfig& config, const ModelGeometry& g) {
  check_parallel_config(config);
  check_geometry(g);
  const int tp = config.tensor_parallel_size;
  const int dp = config.data_parallel_size;
  ParallelLayout layout;
  layout.config = config;
  layout.geometry = g;

  check_tp_divides(config, g.num_heads, "num_attention_heads");
  if (tp <= g.num_kv_heads) {
    check_tp_divides(config, g.num_kv_heads, "num_key_value_heads");
  } else {
    // More ranks than KV heads: vLLM replicates each KV head over tp / num_kv_heads ranks (the
    // query heads of one group then span several ranks). That needs whole replicas.
    M3_CHECK(tp % g.num_kv_heads == 0,
             "{}: more ranks than num_key_value_heads {}, so each KV head is replicated, and {} is not a "
             "multiple of {}",
             tp_option(config), g.num_kv_heads, tp, g.num_kv_heads);
    layout.kv_head_replicas = tp / g.num_kv_heads;
  }
  // Index head j of KV group g picks the blocks for that group's query heads (docs/reference.md
  // D2), so a rank holding a KV head must hold its index heads: a whole number per group.
  M3_CHECK(tp == 1 || g.index_heads % g.num_kv_heads == 0,
           "{}: index_n_heads {} is not a multiple of num_key_value_heads {}, so the index heads cannot follow "
           "their KV groups onto the ranks",
           tp_option(config), g.index_heads, g.num_kv_heads);
  if (g.dense_intermediate_size > 0) check_tp_divides(config, g.dense_intermediate_size, "dense_intermediate_size");
  if (g.num_experts > 0 && g.shared_intermediate_size > 0)
    check_tp_divides(config, g.shared_intermediate_size, "shared_intermediate_size");

  if (config.enable_expert_parallel) {
    layout.expert_parallel_size = config.world_size();
    const int ep = layout.expert_parallel_size;
    M3_CHECK(g.num_experts > 0, "--enable-expert-parallel: the model has no routed experts (no MoE layer)");
    M3_CHECK(ep <= g.num_experts,
             "--enable-expert-parallel: EP size {} (-tp {} x --data-parallel-size {}) is more ranks than "
             "num_local_experts {}; a rank would hold no expert",
             ep, tp, dp, g.num_experts);
    M3_CHECK(g.num_experts % ep == 0,
             "--enable-expert-parallel: num_local_experts {} is not a multiple of the EP size {} (-tp {} x "
             "--data-parallel-size {})",
             g.num_experts, ep, tp, dp);
  } else if (g.num_experts > 0) {
    check_tp_divides(config, g.moe_intermediate_size, "intermediate_size (one routed expert)");
  }

  // Any vocabulary splits: pad it up to the next multiple of tp (vLLM pads too) rather than
  // reject an odd size; the padded rows of embed and lm_head are zeros, and their logits are
  // never sampled.
  layout.padded_vocab_size = (int64_t(g.vocab_size) + tp - 1) / tp * tp;

  const int kv_per_rank = tp <= g.num_kv_heads ? g.num_kv_heads / tp : 1;
  const int index_per_kv = g.index_heads / g.num_kv_heads;
  for (int r = 0; r < config.world_size(); ++r) {
    RankShard s;
    s.rank = r;
    s.dp_rank = r / tp;
    s.tp_rank = r % tp;
    s.q_heads = even_part(g.num_heads, tp, s.tp_rank);
    const int64_t first_kv = tp <= g.num_kv_heads ? int64_t(s.tp_rank) * kv_per_rank : s.tp_rank / layout.kv_head_replicas;
    s.kv_heads = {first_kv, kv_per_rank};
    s.index_heads = tp == 1 ? Slice{0, g.index_heads} : Slice{first_kv * index_per_kv, int64_t(kv_per_rank) * index_per_kv};
    if (g.dense_intermediate_size > 0) s.dense_intermediate = even_part(g.dense_intermediate_size, tp, s.tp_rank);
    if (g.num_experts > 0) {
      s.shared_intermediate = even_part(g.shared_intermediate_size, tp, s.tp_rank);
      if (config.enable_expert_parallel) {
        s.ep_rank = r;
        s.experts = even_part(g.num_experts, layout.expert_parallel_size, r);
        s.expert_intermediate = {0, g.moe_intermediate_size};
      } else {
        s.experts = {0, g.num_experts};
        s.expert_intermediate = even_part(g.moe_intermediate_size, tp, s.tp_rank);
      }
    }
    s.vocab = even_part(layout.padded_vocab_size, tp, s.tp_rank);
    layout.ranks.push_back(s);
  }
  return layout;
}

}  // namespace m3
