// config.json -> ModelConfig with the semantics of transformers 5.17's MiniMaxM3VLTextConfig /
// MiniMaxM3VLConfig (the code wins over the spec text): class defaults, legacy
// sparse_attention_config keys mapped onto index_*, layer_types from sparse_attention_freq,
// mlp_layer_types from moe_layer_freq. Settings the reference would silently compute differently
// from the checkpoint's intent, or that m3serve cannot run, are rejected naming the field.
#include "model/config.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "model/config_fields.h"

namespace m3 {

using config_detail::Fields;

namespace {

constexpr const char* kFullAttention = "full_attention";
constexpr const char* kSparseAttention = "minimax_m3_sparse";

int positive_int(const Fields& f, const char* key, int64_t fallback) {
  int64_t v = f.get_int(key, fallback);
  if (v <= 0 || v > (int64_t{1} << 31) - 1)
    f.reject(key, fmt::format("must be a positive integer, got {}", v));
  return static_cast<int>(v);
}

int non_negative_int(const Fields& f, const char* key, int64_t fallback) {
  int64_t v = f.get_int(key, fallback);
  if (v < 0 || v > (int64_t{1} << 31) - 1) f.reject(key, fmt::format("must be >= 0, got {}", v));
  return static_cast<int>(v);
}

// Fields whose value changes what the model computes but that the reference ignores: accept only
// the value the reference's computation matches.
void reject_unsupported(const Fields& t) {
  if (t.get_bool("attention_output_gate", false))
    t.reject("attention_output_gate", "true is not supported (MiniMax-M3 has no output gate)");
  if (!t.get_bool("use_gemma_norm", true))
    t.reject("use_gemma_norm", "false is not supported (every norm is Gemma-style (1 + w))");
  if (!t.get_bool("use_qk_norm", true))
    t.reject("use_qk_norm", "false is not supported (q_norm / k_norm are always applied)");
  if (std::string v = t.get_string("qk_norm_type", "per_head"); v != "per_head")
    t.reject("qk_norm_type", fmt::format("'{}' is not supported (only 'per_head')", v));
  if (std::string v = t.get_string("scoring_func", "sigmoid"); v != "sigmoid")
    t.reject("scoring_func", fmt::format("'{}' is not supported (only 'sigmoid')", v));
  if (!t.get_bool("use_routing_bias", true))
    t.reject("use_routing_bias", "false is not supported (routing uses e_score_correction_bias)");
  if (std::string v = t.get_string("hidden_act", "silu"); v != "swigluoai" && v != "silu")
    t.reject("hidden_act", fmt::format("'{}' is not supported (swigluoai, or silu as the "
                                       "reference normalises it)",
                                       v));
  if (double beta = t.get_number("swiglu_beta", 1.0); beta != 1.0)
    t.reject("swiglu_beta",
             fmt::format("{} is not supported (the reference computes up + 1)", beta));
  for (const char* key : {"n_group", "topk_group"})
    if (int64_t v = t.get_int(key, 1); v > 1)
      t.reject(key, fmt::format("{}: grouped expert selection is not supported", v));
  if (const nlohmann::json* v = t.raw("sliding_window"))
    t.reject("sliding_window", fmt::format("{} is not supported (MiniMax-M3 has no sliding "
                                           "window)",
                                           v->dump()));
}

std::vector<AttentionKind> parse_layer_types(const Fields& f, const std::vector<std::string>& v) {
  std::vector<AttentionKind> out;
  for (const auto& s : v) {
    if (s == kFullAttention)
      out.push_back(AttentionKind::kFull);
    else if (s == kSparseAttention)
      out.push_back(AttentionKind::kSparse);
    else
      f.reject("layer_types", fmt::format("unknown layer type '{}' (expected '{}' or '{}')", s,
                                          kFullAttention, kSparseAttention));
  }
  return out;
}

std::vector<MlpKind> parse_mlp_layer_types(const Fields& f, const std::vector<std::string>& v) {
  std::vector<MlpKind> out;
  for (const auto& s : v) {
    if (s == "sparse")
      out.push_back(MlpKind::kMoe);
    else if (s == "dense")
      out.push_back(MlpKind::kDense);
    else
      f.reject("mlp_layer_types",
               fmt::format("unknown mlp layer type '{}' (expected 'sparse' or 'dense')", s));
  }
  return out;
}

// Absent -> the class default; explicit null -> none (bos -1, no eos ids).
void parse_special_tokens(const Fields& t, ModelConfig& c) {
  c.bos_token_id =
      t.present("bos_token_id") ? static_cast<int>(t.get_int("bos_token_id", -1)) : 200034;
  c.eos_token_ids.clear();
  if (!t.present("eos_token_id")) {
    c.eos_token_ids.push_back(200020);
  } else if (const nlohmann::json* eos = t.raw("eos_token_id")) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (!e.is_number_integer())
          t.reject("eos_token_id", "expected an integer or a list of integers");
        c.eos_token_ids.push_back(e.get<int>());
      }
    } else {
      t.reject("eos_token_id", "expected an integer or a list of integers");
    }
  }
}

}  // namespace

// ---- ModelConfig ----

bool ModelConfig::has_sparse_layers() const { return num_sparse_layers() > 0; }

int ModelConfig::num_sparse_layers() const {
  int n = 0;
  for (AttentionKind k : attention_kinds) n += k == AttentionKind::kSparse;
  return n;
}

int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (MlpKind k : mlp_kinds) n += k == MlpKind::kMoe;
  return n;
}

void override_num_layers(ModelConfig& config, int num_layers) {
  M3_CHECK(num_layers >= 1 && num_layers <= config.num_layers,
           "--num-layers {} is outside [1, {}] (num_hidden_layers of the config)", num_layers,
           config.num_layers);
  config.num_layers = num_layers;
  config.attention_kinds.resize(num_layers);
  config.mlp_kinds.resize(num_layers);
}

ModelConfig parse_model_config(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) fail("{}: not a JSON object", source);
  const Fields top(json, source, "");
  ModelConfig c;
  if (!top.has("model_type")) top.reject("model_type", "missing (required)");
  c.model_type = top.get_string("model_type", "");

  nlohmann::json empty = nlohmann::json::object();
  std::optional<Fields> text_opt;
  bool outer_tie = false;
  if (c.model_type == "minimax_m3_vl") {
    c.vl_wrapper = true;
    text_opt = top.opt_object("text_config");
    if (!text_opt) M3_LOG_WARN("{}: no text_config; using the reference's defaults", source);
    outer_tie = top.get_bool("tie_word_embeddings", false);
  } else if (c.model_type == "minimax_m3_vl_text" || c.model_type == "minimax_m3") {
    text_opt = top;
  } else {
    top.reject("model_type", fmt::format("'{}' is not a MiniMax-M3 model (expected "
                                         "'minimax_m3_vl' or 'minimax_m3_vl_text')",
                                         c.model_type));
  }
  const Fields t = text_opt ? *text_opt : Fields(empty, source, "text_config.");
  reject_unsupported(t);

  // Class defaults of MiniMaxM3VLTextConfig (= the full-size model).
  c.vocab_size = positive_int(t, "vocab_size", 200064);
  c.hidden_size = positive_int(t, "hidden_size", 6144);
  c.num_layers = positive_int(t, "num_hidden_layers", 60);
  c.num_heads = positive_int(t, "num_attention_heads", 64);
  c.num_kv_heads = positive_int(t, "num_key_value_heads", 4);
  c.head_dim = positive_int(t, "head_dim", 128);
  c.max_position_embeddings = positive_int(t, "max_position_embeddings", 524288);
  c.rms_norm_eps = static_cast<float>(t.get_number("rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps > 0)) t.reject("rms_norm_eps", "must be positive");
  if (c.num_heads % c.num_kv_heads != 0)
    t.reject("num_key_value_heads",
             fmt::format("{} does not divide num_attention_heads {}", c.num_kv_heads, c.num_heads));

  // num_experts is the reference's attribute_map alias of num_local_experts.
  const char* experts_key =
      t.has("num_local_experts") || !t.has("num_experts") ? "num_local_experts" : "num_experts";
  c.num_experts = positive_int(t, experts_key, 128);
  c.experts_per_token = positive_int(t, "num_experts_per_tok", 4);
  c.moe_intermediate_size = positive_int(t, "intermediate_size", 3072);
  const int n_shared = positive_int(t, "n_shared_experts", 1);
  c.shared_intermediate_size = positive_int(t, "shared_intermediate_size", 3072) * n_shared;
  c.dense_intermediate_size = positive_int(t, "dense_intermediate_size", 12288);
  c.routed_scaling_factor = static_cast<float>(t.get_number("routed_scaling_factor", 2.0));
  c.swiglu_alpha = static_cast<float>(t.get_number("swiglu_alpha", 1.702));
  c.swiglu_limit = static_cast<float>(t.get_number("swiglu_limit", 7.0));
  if (c.experts_per_token > c.num_experts)
    t.reject("num_experts_per_tok", fmt::format("{} exceeds {} {}", c.experts_per_token,
                                                t.name(experts_key), c.num_experts));

  // Indexer: flat fields, then the legacy sparse_attention_config keys override them.
  c.index_heads = positive_int(t, "index_n_heads", 4);
  c.index_head_dim = positive_int(t, "index_head_dim", 128);
  c.index_block_size = positive_int(t, "index_block_size", 128);
  c.index_topk_blocks = positive_int(t, "index_topk_blocks", 16);
  c.index_local_blocks = non_negative_int(t, "index_local_blocks", 1);
  c.index_init_blocks = non_negative_int(t, "index_init_blocks", 0);
  std::optional<Fields> sparse = t.opt_object("sparse_attention_config");
  std::optional<std::vector<bool>> sparse_freq;
  if (sparse) {
    const Fields& s = *sparse;
    if (s.has("sparse_num_index_heads"))
      c.index_heads = positive_int(s, "sparse_num_index_heads", 0);
    if (s.has("sparse_index_dim")) c.index_head_dim = positive_int(s, "sparse_index_dim", 0);
    if (s.has("sparse_block_size")) c.index_block_size = positive_int(s, "sparse_block_size", 0);
    if (s.has("sparse_topk_blocks")) c.index_topk_blocks = positive_int(s, "sparse_topk_blocks", 0);
    if (s.has("sparse_local_block"))
      c.index_local_blocks = non_negative_int(s, "sparse_local_block", 0);
    if (s.has("sparse_init_block"))
      c.index_init_blocks = non_negative_int(s, "sparse_init_block", 0);
    if (std::string v = s.get_string("sparse_score_type", "max"); v != "max")
      s.reject("sparse_score_type", fmt::format("'{}' is not supported (only 'max')", v));
    sparse_freq = s.opt_flags("sparse_attention_freq");
    if (auto no_value = s.opt_flags("sparse_disable_index_value"); no_value && sparse_freq) {
      for (std::size_t i = 0; i < sparse_freq->size(); ++i)
        if ((*sparse_freq)[i] && !(i < no_value->size() && (*no_value)[i]))
          s.reject("sparse_disable_index_value",
                   fmt::format("layer {} is sparse with the index value path enabled; only "
                               "score-only indexers (flag 1) are supported",
                               i));
    }
    if (!s.get_bool("use_sparse_attention", true) && sparse_freq)
      M3_LOG_WARN(
          "{}: use_sparse_attention is false but, as in the reference, "
          "sparse_attention_freq still selects the sparse layers",
          source);
  }

  // layer_types, else legacy sparse_attention_freq, else all full attention.
  if (auto names = t.opt_strings("layer_types")) {
    c.attention_kinds = parse_layer_types(t, *names);
    if (static_cast<int>(c.attention_kinds.size()) != c.num_layers)
      t.reject("layer_types", fmt::format("has {} entries for num_hidden_layers {}",
                                          c.attention_kinds.size(), c.num_layers));
  } else if (sparse_freq) {
    for (bool f : *sparse_freq)
      c.attention_kinds.push_back(f ? AttentionKind::kSparse : AttentionKind::kFull);
    if (static_cast<int>(c.attention_kinds.size()) != c.num_layers)
      sparse->reject("sparse_attention_freq", fmt::format("has {} entries for num_hidden_layers {}",
                                                          c.attention_kinds.size(), c.num_layers));
  } else {
    c.attention_kinds.assign(c.num_layers, AttentionKind::kFull);
  }

  // mlp_layer_types, else legacy moe_layer_freq, else all MoE.
  if (auto names = t.opt_strings("mlp_layer_types")) {
    c.mlp_kinds = parse_mlp_layer_types(t, *names);
    if (static_cast<int>(c.mlp_kinds.size()) != c.num_layers)
      t.reject("mlp_layer_types", fmt::format("has {} entries for num_hidden_layers {}",
                                              c.mlp_kinds.size(), c.num_layers));
  } else if (auto freq = t.opt_flags("moe_layer_freq")) {
    for (bool f : *freq) c.mlp_kinds.push_back(f ? MlpKind::kMoe : MlpKind::kDense);
    if (static_cast<int>(c.mlp_kinds.size()) != c.num_layers)
      t.reject("moe_layer_freq", fmt::format("has {} entries for num_hidden_layers {}",
                                             c.mlp_kinds.size(), c.num_layers));
  } else {
    c.mlp_kinds.assign(c.num_layers, MlpKind::kMoe);
  }

  if (c.has_sparse_layers()) {
    const std::string heads_field = sparse && sparse->has("sparse_num_index_heads")
                                        ? sparse->name("sparse_num_index_heads")
                                        : t.name("index_n_heads");
    if (c.index_heads != c.num_kv_heads)
      fail("{}: {}: {} index heads for {} KV heads; m3serve requires one index head per KV group",
           source, heads_field, c.index_heads, c.num_kv_heads);
    if (c.index_local_blocks + c.index_init_blocks > c.index_topk_blocks)
      fail(
          "{}: index_local_blocks {} + index_init_blocks {} exceed index_topk_blocks {} (forced "
          "blocks count inside the top-k)",
          source, c.index_local_blocks, c.index_init_blocks, c.index_topk_blocks);
    if (c.index_local_blocks < 1)
      fail(
          "{}: index_local_blocks must be >= 1 on sparse models (the query's own block is always "
          "attended)",
          source);
  }

  c.rope = config_detail::parse_rope(t, c.head_dim, c.max_position_embeddings,
                                     {kFullAttention, kSparseAttention});
  if (c.rope.rotary_dim > c.head_dim)
    t.reject("partial_rotary_factor", "rotates more channels than head_dim");

  parse_special_tokens(t, c);
  c.tie_word_embeddings = outer_tie || t.get_bool("tie_word_embeddings", false);

  if (auto mlx = top.opt_object("quantization"); mlx && mlx->has("bits"))
    top.reject("quantization", "MLX affine quantization is not supported");
  // VL checkpoints put quantization_config at the top level; text-only ones beside the fields.
  if (auto q = top.opt_object("quantization_config")) {
    c.quant = config_detail::parse_quant_config(*q);
  } else if (c.vl_wrapper && text_opt) {
    if (auto qt = t.opt_object("quantization_config"))
      c.quant = config_detail::parse_quant_config(*qt);
  }
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  std::filesystem::path path = model_dir;
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path.string());
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  return parse_model_config(json, path.string());
}

}  // namespace m3
