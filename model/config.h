// The text model's configuration, read from a Hugging Face config.json of model_type
// `minimax_m3_vl_text`, or `minimax_m3_vl` with the text fields under `text_config`. Both current
// and legacy field names are accepted (spec/model.md, spec/checkpoint-and-chat.md section 1).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3 {

enum class AttentionKind { kFull, kSparse };  // layer_types: full_attention | minimax_m3_sparse
enum class MlpKind { kDense, kMoe };          // mlp_layer_types: dense | sparse

// RoPE as modeling_rope_utils computes it: inv_freq over the rotated channels, and the scaling
// applied to cos/sin ("attention_factor").
struct RopeConfig {
  std::string type = "default";  // default, linear, dynamic, yarn, llama3, ...
  double theta = 5000000.0;
  double partial_rotary_factor = 1.0;
  int rotary_dim = 0;  // channels rotated = int(head_dim * partial_rotary_factor)
  double factor = 1.0;
  double attention_factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;
  std::vector<float> inv_freq;  // [rotary_dim / 2], computed at load
};

// Weight quantization declared by the checkpoint (`quantization_config`).
struct QuantConfig {
  std::string method;  // "" (none), "mxfp8", "fp8", "compressed-tensors", "modelopt"
  std::string moe_format;  // e.g. "nvfp4-pack-quantized"
  std::vector<std::string> ignored_layers;
};

struct ModelConfig {
  std::string model_type;  // as written in config.json (outer type for VL checkpoints)
  bool vl_wrapper = false;  // text fields came from text_config
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  long max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;

  std::vector<AttentionKind> attention_kinds;  // [num_layers]
  std::vector<MlpKind> mlp_kinds;              // [num_layers]

  int num_experts = 0;
  int experts_per_token = 0;
  int moe_intermediate_size = 0;     // intermediate_size: one routed expert
  int shared_intermediate_size = 0;  // shared_intermediate_size * n_shared_experts
  int dense_intermediate_size = 0;
  float routed_scaling_factor = 1.0f;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;

  int index_heads = 0;
  int index_head_dim = 0;
  int index_block_size = 128;
  int index_topk_blocks = 16;
  int index_local_blocks = 1;
  int index_init_blocks = 0;

  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  bool tie_word_embeddings = false;
  QuantConfig quant;

  bool has_sparse_layers() const;
  int num_sparse_layers() const;
};

// Reads <dir>/config.json. Errors name the file and the field.
ModelConfig load_model_config(const std::filesystem::path& model_dir);
// Parses an already-read config.json; `source` names it in error messages.
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);

}  // namespace m3
