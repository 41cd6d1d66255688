// The sizes of a model that decide how it splits over ranks, in ops-level terms (parallel/ cannot
// see the model's config; model/ fills this from it). A size of 0 means the model has no such
// part (no sparse layers: index_heads 0; no MoE layers: num_experts 0; no dense layers:
// dense_intermediate_size 0), and nothing is split or checked for it.
#pragma once

namespace m3 {

struct ModelGeometry {
  int num_heads = 0;     // query heads (num_attention_heads)
  int num_kv_heads = 0;  // num_key_value_heads; query head n uses KV head n / (num_heads / num_kv_heads)
  int head_dim = 0;
  int index_heads = 0;  // index-query heads (index_n_heads); -tp > 1 needs a whole number per KV group
  int num_experts = 0;  // routed experts per MoE layer (num_local_experts)
  int moe_intermediate_size = 0;     // one routed expert (intermediate_size)
  int shared_intermediate_size = 0;  // the shared expert
  int dense_intermediate_size = 0;   // the MLP of dense layers
  int vocab_size = 0;
};

}  // namespace m3
