// A three-layer MiniMax-M3 config (a dense full-attention layer, then two sparse MoE layers) with
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

}  // namespace m3::testing
