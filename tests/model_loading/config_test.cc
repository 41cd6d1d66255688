// config.json parsing against transformers 5.17's MiniMaxM3VLTextConfig / MiniMaxM3VLConfig
// semantics: defaults, current and legacy field names, the VL nesting, RoPE variants, quantization
// schemas, and every rejection naming its field.
#include "model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/error.h"

namespace m3 {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

const std::string kFixtures = "tests/model_loading/fixtures/";

ModelConfig parse(const std::string& text) {
  return parse_model_config(json::parse(text), "test.json");
}

std::string parse_error(const json& j) {
  try {
    parse_model_config(j, "test.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small valid text config with sparse and MoE layers; tests patch fields into it.
json tiny() {
  return json::parse(R"({
    "model_type": "minimax_m3_vl_text", "vocab_size": 64, "hidden_size": 32,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 16, "shared_intermediate_size": 16, "dense_intermediate_size": 48,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
    "mlp_layer_types": ["dense", "sparse", "sparse"],
    "index_n_heads": 2, "index_head_dim": 16, "index_block_size": 8, "index_topk_blocks": 4})");
}

std::vector<AttentionKind> kinds(std::initializer_list<int> sparse) {
  std::vector<AttentionKind> out;
  for (int s : sparse) out.push_back(s ? AttentionKind::kSparse : AttentionKind::kFull);
  return out;
}

TEST(Config, RealM3VlConfig) {
  ModelConfig c = load_model_config(kFixtures + "m3_vl_config.json");
  EXPECT_EQ(c.model_type, "minimax_m3_vl");
  EXPECT_TRUE(c.vl_wrapper);
  EXPECT_EQ(c.vocab_size, 200064);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 60);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.rope.theta, 5e6);
  EXPECT_EQ(c.rope.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.rope.rotary_dim, 64);
  EXPECT_EQ(c.rope.attention_factor, 1.0);
  ASSERT_EQ(c.rope.inv_freq.size(), 32u);
  EXPECT_EQ(c.rope.inv_freq[0], 1.0f);
  ASSERT_EQ(c.attention_kinds.size(), 60u);
  ASSERT_EQ(c.mlp_kinds.size(), 60u);
  for (int i = 0; i < 60; ++i) {
    EXPECT_EQ(c.attention_kinds[i], i < 3 ? AttentionKind::kFull : AttentionKind::kSparse) << i;
    EXPECT_EQ(c.mlp_kinds[i], i < 3 ? MlpKind::kDense : MlpKind::kMoe) << i;
  }
  EXPECT_EQ(c.num_sparse_layers(), 57);
  EXPECT_EQ(c.num_moe_layers(), 57);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.experts_per_token, 4);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.shared_intermediate_size, 3072);
  EXPECT_EQ(c.dense_intermediate_size, 12288);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.0f);
  EXPECT_FLOAT_EQ(c.swiglu_alpha, 1.702f);
  EXPECT_FLOAT_EQ(c.swiglu_limit, 7.0f);
  EXPECT_EQ(c.index_heads, 4);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_block_size, 128);
  EXPECT_EQ(c.index_topk_blocks, 16);
  EXPECT_EQ(c.index_local_blocks, 1);
  EXPECT_EQ(c.index_init_blocks, 0);
  EXPECT_EQ(c.bos_token_id, 200034);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{200020});
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.quant.method, "mxfp8");
  EXPECT_EQ(c.quant.linear_scheme, QuantScheme::kMxfp8);
  EXPECT_EQ(c.quant.expert_scheme, QuantScheme::kMxfp8);
  EXPECT_TRUE(c.quant.is_ignored("language_model.lm_head"));
  EXPECT_TRUE(c.quant.is_ignored("language_model.model.layers.7.block_sparse_moe.gate"));
  EXPECT_FALSE(c.quant.is_ignored("language_model.model.layers.7.self_attn.q_proj"));
}

TEST(Config, RealM31VlConfig) {
  ModelConfig c = load_model_config(kFixtures + "m31_vl_config.json");
  EXPECT_EQ(c.num_sparse_layers(), 60);
  EXPECT_EQ(c.num_moe_layers(), 57);
  EXPECT_EQ(c.quant.linear_scheme, QuantScheme::kMxfp8);
  EXPECT_EQ(c.quant.expert_scheme, QuantScheme::kNvfp4);
  EXPECT_FALSE(c.quant.nvfp4_modelopt);
  EXPECT_EQ(c.quant.moe_format, "nvfp4-pack-quantized");
}

TEST(Config, CurrentFieldNames) {
  ModelConfig c = load_model_config(kFixtures + "text_current_config.json");
  EXPECT_FALSE(c.vl_wrapper);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.attention_kinds, kinds({0, 1}));
  EXPECT_EQ(c.mlp_kinds, (std::vector<MlpKind>{MlpKind::kDense, MlpKind::kMoe}));
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.rotary_dim, 16);
  EXPECT_EQ(c.index_heads, 2);
  EXPECT_EQ(c.index_head_dim, 16);
  EXPECT_EQ(c.index_block_size, 8);
  EXPECT_EQ(c.index_topk_blocks, 4);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{2, 3}));
  EXPECT_EQ(c.quant.method, "");
  EXPECT_EQ(c.quant.linear_scheme, QuantScheme::kNone);
}

TEST(Config, LoadsConfigJsonFromADirectory) {
  ModelConfig c = load_model_config("tests/model_loading/fixtures/dir_with_config");
  EXPECT_EQ(c.num_layers, 2);
}

TEST(Config, ClassDefaultsWhenFieldsAreAbsent) {
  ModelConfig c = parse(R"({"model_type": "minimax_m3_vl_text"})");
  EXPECT_EQ(c.vocab_size, 200064);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 60);
  EXPECT_EQ(c.head_dim, 128);  // the class default, not hidden / heads (= 96)
  EXPECT_EQ(c.max_position_embeddings, 524288);
  EXPECT_EQ(c.attention_kinds, std::vector<AttentionKind>(60, AttentionKind::kFull));
  EXPECT_EQ(c.mlp_kinds, std::vector<MlpKind>(60, MlpKind::kMoe));
  EXPECT_EQ(c.rope.theta, 5e6);  // default_theta
  EXPECT_EQ(c.rope.partial_rotary_factor, 1.0);
  EXPECT_EQ(c.rope.rotary_dim, 128);
  EXPECT_EQ(c.index_heads, 4);
  EXPECT_EQ(c.index_topk_blocks, 16);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.shared_intermediate_size, 3072);
  EXPECT_EQ(c.bos_token_id, 200034);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{200020});
  // The VL wrapper without text_config builds the default text config too.
  ModelConfig vl = parse(R"({"model_type": "minimax_m3_vl"})");
  EXPECT_TRUE(vl.vl_wrapper);
  EXPECT_EQ(vl.num_layers, 60);
}

TEST(Config, LegacySparseKeysOverrideFlatOnes) {
  json j = tiny();
  j["index_n_heads"] = 7;  // overridden by sparse_num_index_heads, as the reference does
  j["sparse_attention_config"] = {{"sparse_num_index_heads", 2},       {"sparse_index_dim", 8},
                                  {"sparse_block_size", 16},           {"sparse_topk_blocks", 6},
                                  {"sparse_local_block", 2},           {"sparse_init_block", 1},
                                  {"sparse_attention_freq", {1, 0, 1}}};
  ModelConfig c = parse_model_config(j, "t");
  EXPECT_EQ(c.index_heads, 2);
  EXPECT_EQ(c.index_head_dim, 8);
  EXPECT_EQ(c.index_block_size, 16);
  EXPECT_EQ(c.index_topk_blocks, 6);
  EXPECT_EQ(c.index_local_blocks, 2);
  EXPECT_EQ(c.index_init_blocks, 1);
  // layer_types is given, so sparse_attention_freq does not apply.
  EXPECT_EQ(c.attention_kinds, kinds({0, 1, 1}));
  j.erase("layer_types");
  EXPECT_EQ(parse_model_config(j, "t").attention_kinds, kinds({1, 0, 1}));
}

TEST(Config, LegacyMoeLayerFreq) {
  json j = tiny();
  j.erase("mlp_layer_types");
  j["moe_layer_freq"] = {0, 0, 1};
  EXPECT_EQ(parse_model_config(j, "t").mlp_kinds,
            (std::vector<MlpKind>{MlpKind::kDense, MlpKind::kDense, MlpKind::kMoe}));
  j["mlp_layer_types"] = {"sparse", "sparse", "dense"};  // the current field wins
  EXPECT_EQ(parse_model_config(j, "t").mlp_kinds,
            (std::vector<MlpKind>{MlpKind::kMoe, MlpKind::kMoe, MlpKind::kDense}));
  j["moe_layer_freq"] = {true, false, true};
  j.erase("mlp_layer_types");
  EXPECT_EQ(parse_model_config(j, "t").mlp_kinds,
            (std::vector<MlpKind>{MlpKind::kMoe, MlpKind::kDense, MlpKind::kMoe}));
}

TEST(Config, LegacyRopeFields) {
  json j = tiny();
  j.erase("rope_parameters");
  j["rope_theta"] = 5000000;
  j["partial_rotary_factor"] = 0.25;
  j["rotary_dim"] = 4;
  ModelConfig c = parse_model_config(j, "t");
  EXPECT_EQ(c.rope.theta, 5e6);
  EXPECT_EQ(c.rope.rotary_dim, 4);  // int(16 * 0.25)
  // rope_parameters values win over the top-level legacy ones.
  j["rope_parameters"] = {{"rope_theta", 1000.0}, {"partial_rotary_factor", 0.5}};
  c = parse_model_config(j, "t");
  EXPECT_EQ(c.rope.theta, 1000.0);
  EXPECT_EQ(c.rope.rotary_dim, 8);
  // rotary_dim disagreeing with the reference's computation is only a warning.
  j["rotary_dim"] = 12;
  EXPECT_EQ(parse_model_config(j, "t").rope.rotary_dim, 8);
  // Without partial_rotary_factor anywhere the reference rotates every channel.
  j.erase("partial_rotary_factor");
  j["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(parse_model_config(j, "t").rope.rotary_dim, 16);
}

TEST(Config, SharedExpertsMultiplyTheSharedWidth) {
  json j = tiny();
  j["n_shared_experts"] = 2;
  EXPECT_EQ(parse_model_config(j, "t").shared_intermediate_size, 32);
}

TEST(Config, NumExpertsAlias) {
  json j = tiny();
  j.erase("num_local_experts");
  j["num_experts"] = 8;
  EXPECT_EQ(parse_model_config(j, "t").num_experts, 8);
}

TEST(Config, SpecialTokens) {
  json j = tiny();
  j["eos_token_id"] = 5;
  EXPECT_EQ(parse_model_config(j, "t").eos_token_ids, std::vector<int>{5});
  j["eos_token_id"] = {5, 6, 7};
  EXPECT_EQ(parse_model_config(j, "t").eos_token_ids, (std::vector<int>{5, 6, 7}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse_model_config(j, "t").eos_token_ids.empty());
  j["bos_token_id"] = nullptr;
  EXPECT_EQ(parse_model_config(j, "t").bos_token_id, -1);
}

TEST(Config, VlNestingAndTiedEmbeddings) {
  json vl = {{"model_type", "minimax_m3_vl"}, {"text_config", tiny()}};
  ModelConfig c = parse_model_config(vl, "t");
  EXPECT_TRUE(c.vl_wrapper);
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_FALSE(c.tie_word_embeddings);
  vl["text_config"]["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_model_config(vl, "t").tie_word_embeddings);
  vl["text_config"]["tie_word_embeddings"] = false;
  vl["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_model_config(vl, "t").tie_word_embeddings);
  // quantization_config inside text_config is read too.
  vl["text_config"]["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_EQ(parse_model_config(vl, "t").quant.linear_scheme, QuantScheme::kFp8);
}

TEST(Config, OverrideNumLayers) {
  ModelConfig c = load_model_config(kFixtures + "m3_vl_config.json");
  override_num_layers(c, 5);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.attention_kinds, kinds({0, 0, 0, 1, 1}));
  EXPECT_EQ(c.mlp_kinds.size(), 5u);
  EXPECT_THROW(override_num_layers(c, 0), Error);
  EXPECT_THROW(override_num_layers(c, 6), Error);
}

// ---- RoPE ----

double ulp_distance(float a, double b) {
  return std::fabs(a - b) / std::fabs(std::nextafter(a, INFINITY) - a);
}

TEST(ConfigRope, DefaultInvFreqMatchesTheFormula) {
  ModelConfig c = load_model_config(kFixtures + "m3_vl_config.json");
  for (int i = 0; i < 32; ++i) {
    double expect = 1.0 / std::pow(5e6, (2.0 * i) / 64.0);
    EXPECT_LE(ulp_distance(c.rope.inv_freq[i], expect), 1.0) << i;
  }
}

RopeConfig rope_of(const json& params, int64_t max_pos = 256, json extra = json::object()) {
  json j = tiny();
  j["head_dim"] = 64;
  j["max_position_embeddings"] = max_pos;
  j["rope_parameters"] = params;
  for (auto& [k, v] : extra.items()) j[k] = v;
  return parse_model_config(j, "t").rope;
}

TEST(ConfigRope, Linear) {
  RopeConfig r = rope_of({{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 10000.0}});
  ASSERT_EQ(r.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i)
    EXPECT_LE(ulp_distance(r.inv_freq[i], 1.0 / std::pow(10000.0, 2.0 * i / 64) / 4), 1.5) << i;
  EXPECT_EQ(r.attention_factor, 1.0);
}

TEST(ConfigRope, LegacyRopeScalingWinsAndTypeKeyIsAccepted) {
  json extra = {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}, {"rope_theta", 500.0}};
  RopeConfig r = rope_of({{"rope_type", "default"}}, 256, extra);
  EXPECT_EQ(r.type, "linear");
  EXPECT_EQ(r.theta, 500.0);
  EXPECT_LE(ulp_distance(r.inv_freq[1], 1.0 / std::pow(500.0, 2.0 / 64) / 2), 1.5);
}

TEST(ConfigRope, DynamicEqualsDefaultUpToMaxPositions) {
  RopeConfig d = rope_of({{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 10000.0}});
  RopeConfig r = rope_of({{"rope_type", "default"}, {"rope_theta", 10000.0}});
  EXPECT_EQ(d.inv_freq, r.inv_freq);
}

TEST(ConfigRope, Yarn) {
  const double theta = 10000, factor = 8, original = 64;
  RopeConfig r = rope_of({{"rope_type", "yarn"},
                          {"factor", factor},
                          {"rope_theta", theta},
                          {"original_max_position_embeddings", 64}},
                         512);
  EXPECT_NEAR(r.attention_factor, 0.1 * std::log(factor) + 1.0, 1e-12);
  // Independent double-precision evaluation of the YaRN ramp.
  const int dim = 64;
  auto corr = [&](double rot) {
    return dim * std::log(original / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = std::max(std::floor(corr(32)), 0.0), high = std::min(std::ceil(corr(1)), dim - 1.0);
  for (int i = 0; i < dim / 2; ++i) {
    double pos = std::pow(theta, 2.0 * i / dim);
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    double extrap = 1 - ramp;
    double expect = (1 / (factor * pos)) * (1 - extrap) + (1 / pos) * extrap;
    EXPECT_NEAR(r.inv_freq[i], expect, 4e-7 * expect) << i;
  }
  // mscale / mscale_all_dim and explicit attention_factor.
  RopeConfig m = rope_of({{"rope_type", "yarn"},
                          {"factor", factor},
                          {"mscale", 0.707},
                          {"mscale_all_dim", 1.0},
                          {"original_max_position_embeddings", 64}},
                         512);
  EXPECT_NEAR(m.attention_factor, (0.1 * 0.707 * std::log(8) + 1) / (0.1 * std::log(8) + 1), 1e-12);
  RopeConfig a =
      rope_of({{"rope_type", "yarn"}, {"factor", factor}, {"attention_factor", 1.5}}, 512);
  EXPECT_EQ(a.attention_factor, 1.5);
  EXPECT_EQ(a.original_max_position_embeddings, 512);  // defaults to max_position_embeddings
}

TEST(ConfigRope, TopLevelOriginalMaxPositionsOverrides) {
  RopeConfig r =
      rope_of({{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 100}},
              512, {{"original_max_position_embeddings", 128}});
  EXPECT_EQ(r.original_max_position_embeddings, 128);
}

TEST(ConfigRope, Llama3) {
  const double theta = 500000, factor = 8, low = 1, high = 4, old = 8192;
  RopeConfig r = rope_of({{"rope_type", "llama3"},
                          {"factor", factor},
                          {"rope_theta", theta},
                          {"low_freq_factor", low},
                          {"high_freq_factor", high},
                          {"original_max_position_embeddings", 8192}},
                         131072);
  int seen_high = 0, seen_low = 0, seen_mid = 0;
  for (int i = 0; i < 32; ++i) {
    double inv = 1.0 / std::pow(theta, 2.0 * i / 64);
    double wavelen = 2 * std::numbers::pi / inv;
    double expect;
    if (wavelen < old / high) {
      expect = inv, ++seen_high;
    } else if (wavelen > old / low) {
      expect = inv / factor, ++seen_low;
    } else {
      double smooth = (old / wavelen - low) / (high - low);
      expect = (1 - smooth) * inv / factor + smooth * inv, ++seen_mid;
    }
    EXPECT_NEAR(r.inv_freq[i], expect, 2e-6 * expect) << i;
  }
  EXPECT_GT(seen_high, 0);
  EXPECT_GT(seen_low, 0);
  EXPECT_GT(seen_mid, 0);
}

TEST(ConfigRope, Longrope) {
  json shortf = json::array(), longf = json::array();
  for (int i = 0; i < 32; ++i) {
    shortf.push_back(1.0 + i * 0.01);
    longf.push_back(2.0 + i * 0.5);
  }
  RopeConfig r = rope_of({{"rope_type", "longrope"},
                          {"short_factor", shortf},
                          {"long_factor", longf},
                          {"original_max_position_embeddings", 64},
                          {"rope_theta", 10000.0}},
                         256);
  EXPECT_NEAR(r.factor, 4.0, 0);
  EXPECT_NEAR(r.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(64.0)), 1e-12);
  ASSERT_EQ(r.inv_freq_long.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    double pos = std::pow(10000.0, 2.0 * i / 64);
    EXPECT_NEAR(r.inv_freq[i], 1 / (shortf[i].get<double>() * pos), 1e-6 / pos);
    EXPECT_NEAR(r.inv_freq_long[i], 1 / (longf[i].get<double>() * pos), 1e-6 / pos);
  }
}

// ---- quantization_config ----

QuantConfig quant_of(const json& q) {
  json j = tiny();
  j["quantization_config"] = q;
  return parse_model_config(j, "t").quant;
}

TEST(ConfigQuant, Schemes) {
  EXPECT_EQ(quant_of({{"quant_method", "fp8"}}).linear_scheme, QuantScheme::kFp8);
  EXPECT_EQ(quant_of({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}).linear_scheme,
            QuantScheme::kFp8Block);
  QuantConfig fp8_mx =
      quant_of({{"quant_method", "fp8"}, {"weight_block_size", {1, 32}}, {"scale_fmt", "ue8m0"}});
  EXPECT_EQ(fp8_mx.linear_scheme, QuantScheme::kMxfp8);

  QuantConfig ct = quant_of(json::parse(R"({
    "quant_method": "compressed-tensors", "format": "mixed-precision",
    "config_groups": {
      "experts": {"targets": ["re:.*experts.*"], "format": "nvfp4-pack-quantized",
                  "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}},
      "rest": {"targets": ["Linear"], "format": "float-quantized",
               "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}},
    "ignore": ["lm_head", "re:.*mlp\\.gate$"]})"));
  EXPECT_EQ(ct.expert_scheme, QuantScheme::kNvfp4);
  EXPECT_EQ(ct.linear_scheme, QuantScheme::kFp8);
  EXPECT_EQ(ct.moe_format, "nvfp4-pack-quantized");
  EXPECT_FALSE(ct.nvfp4_modelopt);
  EXPECT_TRUE(ct.is_ignored("model.layers.3.mlp.gate"));
  EXPECT_FALSE(ct.is_ignored("model.layers.3.mlp.gate_up_proj"));

  QuantConfig mo = quant_of({{"quant_method", "modelopt"},
                             {"quant_algo", "NVFP4"},
                             {"group_size", 16},
                             {"exclude_modules", {"lm_head", "*block_sparse_moe.gate"}}});
  EXPECT_EQ(mo.linear_scheme, QuantScheme::kNvfp4);
  EXPECT_TRUE(mo.nvfp4_modelopt);
  EXPECT_TRUE(mo.is_ignored("language_model.model.layers.3.block_sparse_moe.gate"));

  QuantConfig mixed = quant_of(json::parse(R"({
    "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
    "quantized_layers": {
      "language_model.model.layers.3.block_sparse_moe.experts.0.w1": {"quant_algo": "NVFP4", "group_size": 16},
      "language_model.model.layers.3.self_attn.q_proj": {"quant_algo": "MXFP8"}}})"));
  EXPECT_EQ(mixed.expert_scheme, QuantScheme::kNvfp4);
  EXPECT_EQ(mixed.linear_scheme, QuantScheme::kMxfp8);

  QuantConfig nested =
      quant_of({{"quant_method", "modelopt"}, {"quantization", {{"quant_algo", "FP8"}}}});
  EXPECT_EQ(nested.linear_scheme, QuantScheme::kFp8);
}

// ---- rejections ----

struct Rejection {
  const char* label;
  std::function<void(json&)> patch;
  std::string field;  // must appear in the message
};

class ConfigRejects : public ::testing::TestWithParam<Rejection> {};

TEST_P(ConfigRejects, NamingTheField) {
  json j = tiny();
  GetParam().patch(j);
  std::string err = parse_error(j);
  ASSERT_FALSE(err.empty()) << GetParam().label << " was accepted";
  EXPECT_THAT(err, HasSubstr("test.json")) << err;
  EXPECT_THAT(err, HasSubstr(GetParam().field)) << err;
}

INSTANTIATE_TEST_SUITE_P(
    Config, ConfigRejects,
    ::testing::Values(
        Rejection{"missing_model_type", [](json& j) { j.erase("model_type"); }, "model_type"},
        Rejection{"other_model_type", [](json& j) { j["model_type"] = "llama"; }, "model_type"},
        Rejection{"string_int", [](json& j) { j["hidden_size"] = "32"; }, "hidden_size"},
        Rejection{"float_int", [](json& j) { j["hidden_size"] = 32.0; }, "hidden_size"},
        Rejection{"negative_vocab", [](json& j) { j["vocab_size"] = -1; }, "vocab_size"},
        Rejection{"string_float", [](json& j) { j["rms_norm_eps"] = "1e-6"; }, "rms_norm_eps"},
        Rejection{"bool_type", [](json& j) { j["tie_word_embeddings"] = 1; }, "tie_word_embeddings"},
        Rejection{"layer_types_length", [](json& j) { j["layer_types"].erase(0); }, "layer_types"},
        Rejection{"layer_types_unknown", [](json& j) { j["layer_types"][0] = "sliding_attention"; },
                  "layer_types"},
        Rejection{"layer_types_not_list", [](json& j) { j["layer_types"] = "full_attention"; },
                  "layer_types"},
        Rejection{"mlp_layer_types_length", [](json& j) { j["mlp_layer_types"].push_back("dense"); },
                  "mlp_layer_types"},
        Rejection{"mlp_layer_types_unknown", [](json& j) { j["mlp_layer_types"][1] = "moe"; },
                  "mlp_layer_types"},
        Rejection{"moe_layer_freq_length",
                  [](json& j) {
                    j.erase("mlp_layer_types");
                    j["moe_layer_freq"] = {0, 1};
                  },
                  "moe_layer_freq"},
        Rejection{"moe_layer_freq_strings",
                  [](json& j) {
                    j.erase("mlp_layer_types");
                    j["moe_layer_freq"] = {"0", "1", "1"};
                  },
                  "moe_layer_freq"},
        Rejection{"sparse_freq_length",
                  [](json& j) {
                    j.erase("layer_types");
                    j["sparse_attention_config"] = {{"sparse_attention_freq", {0, 1}}};
                  },
                  "sparse_attention_config.sparse_attention_freq"},
        Rejection{"index_heads_not_kv_heads", [](json& j) { j["index_n_heads"] = 4; }, "index_n_heads"},
        Rejection{"legacy_index_heads_not_kv_heads",
                  [](json& j) { j["sparse_attention_config"] = {{"sparse_num_index_heads", 1}}; },
                  "sparse_attention_config.sparse_num_index_heads"},
        Rejection{"heads_not_divisible", [](json& j) { j["num_key_value_heads"] = 3; },
                  "num_key_value_heads"},
        Rejection{"output_gate", [](json& j) { j["attention_output_gate"] = true; },
                  "attention_output_gate"},
        Rejection{"score_type",
                  [](json& j) { j["sparse_attention_config"] = {{"sparse_score_type", "mean"}}; },
                  "sparse_score_type"},
        Rejection{"index_value_path",
                  [](json& j) {
                    j["sparse_attention_config"] = {{"sparse_attention_freq", {0, 1, 1}},
                                                    {"sparse_disable_index_value", {0, 1, 0}}};
                  },
                  "sparse_disable_index_value"},
        Rejection{"forced_blocks_exceed_topk", [](json& j) { j["index_local_blocks"] = 5; },
                  "index_topk_blocks"},
        Rejection{"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; }, "scoring_func"},
        Rejection{"routing_bias", [](json& j) { j["use_routing_bias"] = false; }, "use_routing_bias"},
        Rejection{"hidden_act", [](json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
        Rejection{"swiglu_beta", [](json& j) { j["swiglu_beta"] = 2.0; }, "swiglu_beta"},
        Rejection{"gemma_norm", [](json& j) { j["use_gemma_norm"] = false; }, "use_gemma_norm"},
        Rejection{"qk_norm", [](json& j) { j["use_qk_norm"] = false; }, "use_qk_norm"},
        Rejection{"qk_norm_type", [](json& j) { j["qk_norm_type"] = "flat"; }, "qk_norm_type"},
        Rejection{"grouped_topk", [](json& j) { j["n_group"] = 8; }, "n_group"},
        Rejection{"sliding_window", [](json& j) { j["sliding_window"] = 4096; }, "sliding_window"},
        Rejection{"topk_above_experts", [](json& j) { j["num_experts_per_tok"] = 5; },
                  "num_experts_per_tok"},
        Rejection{"eos_type", [](json& j) { j["eos_token_id"] = "</s>"; }, "eos_token_id"},
        Rejection{"eos_list_type", [](json& j) { j["eos_token_id"] = {1, "x"}; }, "eos_token_id"},
        Rejection{"rope_type", [](json& j) { j["rope_parameters"]["rope_type"] = "proportional"; },
                  "rope_parameters.rope_type"},
        Rejection{"rope_per_layer_type",
                  [](json& j) {
                    j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
                  },
                  "rope_parameters"},
        Rejection{"rope_not_object", [](json& j) { j["rope_parameters"] = 3; }, "rope_parameters"},
        Rejection{"linear_without_factor", [](json& j) { j["rope_parameters"]["rope_type"] = "linear"; },
                  "rope_parameters.factor"},
        Rejection{"llama3_without_factors",
                  [](json& j) {
                    j["rope_parameters"]["rope_type"] = "llama3";
                    j["rope_parameters"]["factor"] = 8;
                  },
                  "low_freq_factor"},
        Rejection{"longrope_wrong_length",
                  [](json& j) {
                    j["rope_parameters"] = {{"rope_type", "longrope"},
                                            {"short_factor", {1.0}},
                                            {"long_factor", {1.0}}};
                  },
                  "short_factor"},
        Rejection{"partial_zero", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.0; },
                  "partial_rotary_factor"},
        Rejection{"partial_above_one", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 1.5; },
                  "partial_rotary_factor"},
        Rejection{"odd_rotary", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.3125; },
                  "partial_rotary_factor"},
        Rejection{"theta_negative", [](json& j) { j["rope_parameters"]["rope_theta"] = -1.0; },
                  "rope_theta"},
        Rejection{"quant_unknown", [](json& j) { j["quantization_config"] = {{"quant_method", "awq"}}; },
                  "quantization_config.quant_method"},
        Rejection{"quant_missing_method", [](json& j) { j["quantization_config"] = json::object(); },
                  "quantization_config.quant_method"},
        Rejection{"quant_block",
                  [](json& j) {
                    j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
                  },
                  "quantization_config.weight_block_size"},
        Rejection{"quant_fmt",
                  [](json& j) { j["quantization_config"] = {{"quant_method", "mxfp8"}, {"fmt", "e5m2"}}; },
                  "quantization_config.fmt"},
        Rejection{"quant_moe_algo",
                  [](json& j) {
                    j["quantization_config"] = {{"quant_method", "mxfp8"}, {"moe_quant_algo", "INT4"}};
                  },
                  "quantization_config.moe_quant_algo"},
        Rejection{"quant_ct_int4",
                  [](json& j) {
                    j["quantization_config"] = json::parse(R"({"quant_method": "compressed-tensors",
                      "config_groups": {"g": {"targets": ["Linear"],
                        "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}})");
                  },
                  "config_groups.g.weights.num_bits"},
        Rejection{"quant_modelopt_algo",
                  [](json& j) {
                    j["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}};
                  },
                  "quantization_config.quant_algo"},
        Rejection{"mlx_quantization",
                  [](json& j) { j["quantization"] = {{"bits", 4}, {"group_size", 64}}; }, "quantization"},
        Rejection{"text_config_not_object",
                  [](json& j) {
                    j = {{"model_type", "minimax_m3_vl"}, {"text_config", 5}};
                  },
                  "text_config"},
        Rejection{"vl_nested_field",
                  [](json& j) {
                    json t = j;
                    t["hidden_size"] = "x";
                    j = {{"model_type", "minimax_m3_vl"}, {"text_config", t}};
                  },
                  "text_config.hidden_size"}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Config, UnreadableFilesNameThePath) {
  try {
    load_model_config("tests/model_loading/fixtures/no_such_dir");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no_such_dir"));
  }
  try {
    load_model_config("tests/model_loading/fixtures/not_json.txt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not_json.txt"));
    EXPECT_THAT(e.what(), HasSubstr("not valid JSON"));
  }
}

}  // namespace
}  // namespace m3
