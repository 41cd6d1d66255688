// The text model's configuration, read from a Hugging Face config.json of model_type
// `minimax_m3_vl_text`, or `minimax_m3_vl` with the text fields under `text_config`. Both current
// and legacy field names are accepted (docs/reference.md 2.1).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace m3 {

enum class AttentionKind { kFull, kSparse };  // layer_types: full_attention | minimax_m3_sparse
enum class MlpKind { kDense, kMoe };          // mlp_layer_types: dense | sparse

// RoPE as modeling_rope_utils computes it: inv_freq over the rotated channels, and the scaling
// applied to cos/sin ("attention_factor"). cos/sin = cos|sin(pos * inv_freq) * attention_factor,
// duplicated (concat(freqs, freqs)) over rotary_dim channels, rotate-half pairs
// (c, c + rotary_dim/2).
// The indexer uses the same cos/sin truncated to index_head_dim channels.
struct RopeConfig {
  std::string type = "default";  // default, linear, dynamic, yarn, llama3, longrope
  double theta = 5000000.0;
  double partial_rotary_factor = 1.0;
  int rotary_dim = 0;  // channels rotated = int(head_dim * partial_rotary_factor)
  double factor = 1.0;
  double attention_factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;  // yarn, llama3, longrope
  std::vector<float> inv_freq;  // [rotary_dim / 2], fp32 as the reference computes it
  // longrope only: the reference switches to these when a sequence's length (max position + 1)
  // exceeds original_max_position_embeddings. Empty otherwise.
  std::vector<float> inv_freq_long;
  // "dynamic": inv_freq is the reference's value for sequences up to max_position_embeddings
  // (it recomputes beyond that; m3serve does not serve past max_position_embeddings).
};

// How a group of linear layers is quantized in the checkpoint (quantization_config). The loader
// reads each tensor's real format from its names and dtypes; this says what the config declares
// (used by --load-format dummy, and to reject what m3serve cannot run).
enum class QuantScheme {
  kNone,      // BF16 / F16 / F32
  kFp8,       // F8_E4M3 with one F32 scale per tensor
  kFp8Block,  // F8_E4M3 with F32 scales per 128x128 block (weight_block_size [128, 128])
  kMxfp8,     // F8_E4M3 with UE8M0 scales per 1x32 block
  kNvfp4,     // E2M1 pairs with E4M3 scales per 1x16 block and an F32 global scale
};
std::string_view quant_scheme_name(QuantScheme scheme);

// Weight quantization declared by the checkpoint (`quantization_config`).
struct QuantConfig {
  std::string method;  // "" (none), "mxfp8", "fp8", "compressed-tensors", "modelopt"
  std::string moe_format;  // e.g. "nvfp4-pack-quantized"
  std::vector<std::string> ignored_layers;  // as written (names or "re:" patterns)
  QuantScheme linear_scheme = QuantScheme::kNone;  // attention, indexer, dense MLP, shared experts
  QuantScheme expert_scheme = QuantScheme::kNone;  // routed experts
  // kNvfp4 only: ModelOpt writes weight + weight_scale + weight_scale_2 (a multiplier);
  // compressed-tensors writes weight_packed + weight_scale + weight_global_scale (a divisor).
  bool nvfp4_modelopt = false;
  // True when `name` (a module name such as "model.layers.0.self_attn.q_proj" or "lm_head") is
  // listed in ignored_layers (exact, suffix or "re:" regex match): it stays unquantized.
  bool is_ignored(const std::string& name) const;
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
  int num_moe_layers() const;
};

// Reads <dir>/config.json. Errors name the file and the field.
ModelConfig load_model_config(const std::filesystem::path& model_dir);
// Parses an already-read config.json; `source` names it in error messages.
ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source);
// Keeps the first `num_layers` layers (benchmarks of a truncated model: --num-layers).
void override_num_layers(ModelConfig& config, int num_layers);

}  // namespace m3
