// Three-layer MiniMax-M3 configs (a dense full-attention layer, then two sparse MoE layers) with
// the given quantization_config (null: unquantized), small enough to build weights for in a test.
#pragma once
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace m3::testing {

inline ModelConfig small_quantized_config(const nlohmann::json& quant) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "minimax_m3_vl_text", "vocab_size": 96, "hidden_size": 256,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 96, "shared_intermediate_size": 64, "dense_intermediate_size": 200,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
    "mlp_layer_types": ["dense", "sparse", "sparse"],
    "index_n_heads": 2, "index_head_dim": 32, "index_block_size": 8, "index_topk_blocks": 4})");
  if (!quant.is_null()) j["quantization_config"] = quant;
  return parse_model_config(j, "small-quantized-config");
}

// The same three layers with sizes that split over 1, 2 and 4 ranks in every format, fp8's
// 128x128 blocks included: heads of 128, intermediates of 512, 8 query heads in 2 KV groups
// (replicated at -tp 4) with an index head each, 4 experts, and a vocabulary (1001 by default)
// that neither 2 nor 4 divides.
inline ModelConfig shard_test_config(const nlohmann::json& quant, int vocab = 1001) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "minimax_m3_vl_text", "hidden_size": 256,
    "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
    "intermediate_size": 512, "shared_intermediate_size": 512, "dense_intermediate_size": 512,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
    "mlp_layer_types": ["dense", "sparse", "sparse"],
    "index_n_heads": 2, "index_head_dim": 128, "index_block_size": 8, "index_topk_blocks": 4})");
  j["vocab_size"] = vocab;
  if (!quant.is_null()) j["quantization_config"] = quant;
  return parse_model_config(j, "shard-test-config");
}

}  // namespace m3::testing
