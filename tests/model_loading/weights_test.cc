// load_weights over tiny checkpoints written by the tests: both on-disk layouts, every weight
// format, sharded or not; loaded values (dequantized) must equal what was written, bit for bit.
#include "model/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/model_loading/checkpoint_builder.h"

namespace m3 {
namespace {

using ::testing::AllOf;
using testing::BuildOptions;
using testing::CheckpointBuilder;
using testing::Expected;
using testing::Fmt;
using ::testing::HasSubstr;
using testing::Layout;
using testing::ScratchDir;

// Layer 0: full attention + dense MLP; layers 1, 2: sparse attention + MoE. Widths are not
// multiples of the quantization blocks everywhere (48 = 1.5 MXFP8 blocks) on purpose.
ModelConfig tiny_config(bool tied = false) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "minimax_m3_vl_text", "vocab_size": 64, "hidden_size": 48,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 16, "shared_intermediate_size": 32, "dense_intermediate_size": 40,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256,
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
    "mlp_layer_types": ["dense", "sparse", "sparse"],
    "index_n_heads": 2, "index_head_dim": 16, "index_block_size": 8, "index_topk_blocks": 4})");
  j["tie_word_embeddings"] = tied;
  return parse_model_config(j, "tiny");
}

std::vector<float> dequantized(const LinearWeight& w) {
  std::vector<float> out(w.out_features * w.in_features);
  dequantize_rows(w, 0, w.out_features, out.data());
  return out;
}

std::vector<float> values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kF32);
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

void expect_linear(const LinearWeight& w, const Expected& e, const std::string& key) {
  SCOPED_TRACE(key + " (" + w.name + ")");
  ASSERT_TRUE(e.count(key)) << "no expectation";
  ASSERT_TRUE(w.defined());
  std::vector<float> got = dequantized(w);
  const std::vector<float>& want = e.at(key);
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ < 3)
      ADD_FAILURE() << "element " << i << ": " << got[i] << " != " << want[i];
  EXPECT_EQ(bad, 0);
}

WeightFormat expected_format(Fmt f) {
  switch (f) {
    case Fmt::kBf16:
    case Fmt::kF32:
      return WeightFormat::kDense;
    case Fmt::kMxfp8:
    case Fmt::kMxfp8Renamed:
      return WeightFormat::kMxfp8;
    case Fmt::kFp8Tensor:
      return WeightFormat::kFp8;
    case Fmt::kFp8Block:
      return WeightFormat::kFp8Block;
    case Fmt::kNvfp4Ct:
    case Fmt::kNvfp4ModelOpt:
      return WeightFormat::kNvfp4;
  }
  return WeightFormat::kDense;
}

void check_model(const ModelConfig& c, const ModelWeights& w, const Expected& e,
                 const BuildOptions& o) {
  EXPECT_EQ(w.embed.dtype(), DType::kBF16);  // embeddings stay in their dtype
  std::vector<float> embed(w.embed.numel());
  bf16_to_f32(w.embed.data_as<const uint16_t>(), embed.data(), w.embed.numel());
  EXPECT_EQ(embed, e.at("embed"));
  EXPECT_EQ(values(w.final_norm), e.at("final_norm"));
  if (c.tie_word_embeddings) {
    EXPECT_EQ(w.lm_head.weight.data(), w.embed.data());
    expect_linear(w.lm_head, {{"lm_head", e.at("embed")}}, "lm_head");
  } else {
    expect_linear(w.lm_head, e, "lm_head");
  }
  ASSERT_EQ(w.layers.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const std::string K = "L" + std::to_string(i) + ".";
    const LayerWeights& l = w.layers[i];
    EXPECT_EQ(values(l.input_norm), e.at(K + "input_norm"));
    EXPECT_EQ(values(l.post_attn_norm), e.at(K + "post_norm"));
    expect_linear(l.attn.q, e, K + "q");
    expect_linear(l.attn.k, e, K + "k");
    expect_linear(l.attn.v, e, K + "v");
    expect_linear(l.attn.o, e, K + "o");
    EXPECT_EQ(l.attn.q.format, expected_format(o.linear));
    EXPECT_EQ(values(l.attn.q_norm), e.at(K + "q_norm"));
    EXPECT_EQ(values(l.attn.k_norm), e.at(K + "k_norm"));
    if (i > 0) {
      expect_linear(l.attn.index_q, e, K + "index_q");
      expect_linear(l.attn.index_k, e, K + "index_k");
      EXPECT_EQ(values(l.attn.index_q_norm), e.at(K + "index_q_norm"));
      EXPECT_EQ(values(l.attn.index_k_norm), e.at(K + "index_k_norm"));
    } else {
      EXPECT_FALSE(l.attn.index_q.defined());
    }
    expect_linear(l.mlp.gate, e, K + "gate");
    expect_linear(l.mlp.up, e, K + "up");
    expect_linear(l.mlp.down, e, K + "down");
    if (i == 0) {
      EXPECT_TRUE(l.mlp.experts.empty());
      continue;
    }
    EXPECT_EQ(values(l.mlp.router), e.at(K + "router"));
    EXPECT_EQ(values(l.mlp.router_bias), e.at(K + "router_bias"));
    ASSERT_EQ(l.mlp.experts.size(), 4u);
    for (int x = 0; x < 4; ++x) {
      const std::string KE = K + "e" + std::to_string(x) + ".";
      expect_linear(l.mlp.experts[x].gate, e, KE + "gate");
      expect_linear(l.mlp.experts[x].up, e, KE + "up");
      expect_linear(l.mlp.experts[x].down, e, KE + "down");
      if (o.layout == Layout::kRelease) {
        EXPECT_EQ(l.mlp.experts[x].gate.format, expected_format(o.expert));
      }
    }
  }
}

struct Case {
  const char* label;
  BuildOptions options;
  int shards = 0;  // 0: one model.safetensors
  bool tied = false;
};

class LoadWeights : public ::testing::TestWithParam<Case> {};

TEST_P(LoadWeights, ValuesMatchWhatWasWritten) {
  const Case& k = GetParam();
  ScratchDir dir;
  ModelConfig c = tiny_config(k.tied);
  CheckpointBuilder b(c, k.options);
  b.build();
  if (k.shards)
    b.writer().write_sharded(dir.path(), k.shards);
  else
    b.writer().write(dir / "model.safetensors");

  struct Count : LoadProgress {
    std::size_t last = 0, total = 0;
    void on_tensor(std::size_t done, std::size_t t) override { last = done, total = t; }
  } progress;
  ModelWeights w = load_weights(c, dir.path(), &progress);
  check_model(c, w, b.expected(), k.options);
  EXPECT_EQ(progress.last, progress.total);
  EXPECT_GT(progress.total, 0u);
}

BuildOptions opts(Layout layout, Fmt linear, Fmt expert, bool fused = false,
                  bool dense_in_moe_block = false) {
  BuildOptions o;
  o.layout = layout;
  o.linear = linear;
  o.expert = expert;
  o.fused_dense = fused;
  o.dense_in_moe_block = dense_in_moe_block;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Weights, LoadWeights,
    ::testing::Values(
        Case{"release_bf16", opts(Layout::kRelease, Fmt::kBf16, Fmt::kBf16)},
        Case{"release_f32_fused_dense", opts(Layout::kRelease, Fmt::kF32, Fmt::kF32, true)},
        Case{"release_dense_in_moe_block",
             opts(Layout::kRelease, Fmt::kF32, Fmt::kF32, false, true)},
        Case{"release_mxfp8", opts(Layout::kRelease, Fmt::kMxfp8, Fmt::kMxfp8), 3},
        Case{"release_mxfp8_renamed_scales",
             opts(Layout::kRelease, Fmt::kMxfp8Renamed, Fmt::kMxfp8Renamed)},
        Case{"release_m31_mxfp8_nvfp4_experts", opts(Layout::kRelease, Fmt::kMxfp8, Fmt::kNvfp4Ct),
             2},
        Case{"release_modelopt_nvfp4", opts(Layout::kRelease, Fmt::kMxfp8, Fmt::kNvfp4ModelOpt)},
        Case{"release_nvfp4_everywhere",
             opts(Layout::kRelease, Fmt::kNvfp4Ct, Fmt::kNvfp4Ct, true)},
        Case{"release_fp8_tensor", opts(Layout::kRelease, Fmt::kFp8Tensor, Fmt::kFp8Tensor)},
        Case{"release_fp8_block", opts(Layout::kRelease, Fmt::kFp8Block, Fmt::kFp8Block)},
        Case{"text_save_pretrained_bf16",
             opts(Layout::kTextSavePretrained, Fmt::kBf16, Fmt::kBf16)},
        Case{"text_save_pretrained_tied", opts(Layout::kTextSavePretrained, Fmt::kF32, Fmt::kF32),
             0, true},
        Case{"vl_save_pretrained_f32", opts(Layout::kVlSavePretrained, Fmt::kF32, Fmt::kF32), 4},
        Case{"vl_save_pretrained_mxfp8", opts(Layout::kVlSavePretrained, Fmt::kMxfp8, Fmt::kBf16)}),
    [](const auto& info) { return std::string(info.param.label); });

// ---- errors ----

std::string load_error(const ModelConfig& c, const std::filesystem::path& dir) {
  try {
    load_weights(c, dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class LoadErrors : public ::testing::Test {
 protected:
  void build(BuildOptions o = {}) {
    builder_ = std::make_unique<CheckpointBuilder>(config_, o);
    builder_->build();
  }
  std::string error_after_writing() {
    builder_->writer().write(dir_ / "model.safetensors");
    return load_error(config_, dir_.path());
  }
  testing::SafetensorsWriter& w() { return builder_->writer(); }

  ScratchDir dir_;
  ModelConfig config_ = tiny_config();
  std::unique_ptr<CheckpointBuilder> builder_;
};

TEST_F(LoadErrors, MissingTensorIsNamed) {
  build();
  w().remove("language_model.model.layers.1.self_attn.index_k_proj.weight");
  EXPECT_THAT(error_after_writing(),
              HasSubstr("language_model.model.layers.1.self_attn.index_k_proj.weight"));
}

TEST_F(LoadErrors, MissingExpertIsNamed) {
  build();
  w().remove("language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight");
  EXPECT_THAT(error_after_writing(), HasSubstr("layers.2.block_sparse_moe.experts.3.w2.weight"));
}

TEST_F(LoadErrors, MissingNvfp4GlobalScaleIsNamed) {
  build(opts(Layout::kRelease, Fmt::kBf16, Fmt::kNvfp4Ct));
  w().remove("language_model.model.layers.1.block_sparse_moe.experts.0.w3.weight_global_scale");
  EXPECT_THAT(error_after_writing(), HasSubstr("experts.0.w3.weight_global_scale"));
}

TEST_F(LoadErrors, UnexpectedTensorIsNamed) {
  build();
  w().add_f32("language_model.model.layers.1.self_attn.index_v_proj.weight", {2, 2}, {1, 2, 3, 4});
  std::string err = error_after_writing();
  EXPECT_THAT(err,
              AllOf(HasSubstr("unexpected"), HasSubstr("layers.1.self_attn.index_v_proj.weight"),
                    HasSubstr("model.safetensors")));
}

TEST_F(LoadErrors, LayerBeyondTheConfigIsUnexpected) {
  build();
  w().add_f32("language_model.model.layers.3.input_layernorm.weight", {48}, std::vector<float>(48));
  EXPECT_THAT(error_after_writing(), HasSubstr("layers.3.input_layernorm.weight"));
}

TEST_F(LoadErrors, IndexerOnAFullAttentionLayerIsUnexpected) {
  build();
  w().add_f32("language_model.model.layers.0.self_attn.index_q_norm.weight", {16},
              std::vector<float>(16));
  EXPECT_THAT(error_after_writing(), HasSubstr("layers.0.self_attn.index_q_norm.weight"));
}

TEST_F(LoadErrors, WrongShapeNamesTensorAndShapes) {
  build();
  w().add_f32("language_model.model.layers.0.self_attn.q_proj.weight", {60, 48},
              std::vector<float>(60 * 48));
  EXPECT_THAT(error_after_writing(), AllOf(HasSubstr("layers.0.self_attn.q_proj.weight"),
                                           HasSubstr("[64, 48]"), HasSubstr("[60, 48]")));
}

TEST_F(LoadErrors, WrongScaleShapeIsNamed) {
  build(opts(Layout::kRelease, Fmt::kMxfp8, Fmt::kMxfp8));
  w().add("language_model.model.layers.0.self_attn.k_proj.weight_scale_inv", DType::kU8, {32, 1},
          std::vector<uint8_t>(32, 127));
  EXPECT_THAT(error_after_writing(),
              AllOf(HasSubstr("k_proj.weight_scale_inv"), HasSubstr("[32, 2]")));
}

TEST_F(LoadErrors, WrongDtypeIsNamed) {
  build();
  w().add("language_model.model.norm.weight", DType::kI32, {48}, std::vector<uint8_t>(48 * 4));
  EXPECT_THAT(error_after_writing(),
              AllOf(HasSubstr("language_model.model.norm.weight"), HasSubstr("I32")));
  w().add("language_model.model.norm.weight", DType::kF32, {48}, std::vector<uint8_t>(48 * 4));
  w().add("language_model.lm_head.weight", DType::kI64, {64, 48},
          std::vector<uint8_t>(64 * 48 * 8));
  EXPECT_THAT(error_after_writing(),
              AllOf(HasSubstr("language_model.lm_head.weight"), HasSubstr("I64")));
}

TEST_F(LoadErrors, DenseWeightWithAScaleIsRejected) {
  build();
  w().add("language_model.model.layers.0.self_attn.o_proj.weight_scale_inv", DType::kU8, {48, 2},
          std::vector<uint8_t>(96, 127));
  EXPECT_THAT(error_after_writing(), HasSubstr("o_proj.weight_scale_inv"));
}

TEST_F(LoadErrors, BadGlobalScaleIsRejected) {
  build(opts(Layout::kRelease, Fmt::kBf16, Fmt::kNvfp4Ct));
  w().add_f32("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_global_scale",
              {1}, {0.0f});
  EXPECT_THAT(error_after_writing(), HasSubstr("experts.0.w1.weight_global_scale"));
}

TEST_F(LoadErrors, NoTextModel) {
  testing::SafetensorsWriter only_vision;
  only_vision.add_f32("vision_tower.x.weight", {1}, {1});
  only_vision.write(dir_ / "model.safetensors");
  EXPECT_THAT(load_error(config_, dir_.path()), HasSubstr("no MiniMax-M3 text model"));
}

TEST_F(LoadErrors, TiedConfigIgnoresAnLmHead) {
  config_ = tiny_config(/*tied=*/true);
  build();
  // The builder skips lm_head for tied configs; a stray one is tolerated (the reference ties it).
  w().add_bf16("language_model.lm_head.weight", {64, 48}, std::vector<float>(64 * 48));
  EXPECT_EQ(error_after_writing(), "");
}

// Checkpoints written by transformers 5.17 itself (tools/make_golden_models.py,
// tools/make_release_checkpoint.py): every one must load completely.
TEST(LoadWeights, CheckpointsWrittenByTransformers) {
  const std::filesystem::path root = "tests/model_golden/data";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << root << " is absent";
  int loaded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    const auto dir = entry.path();
    if (!std::filesystem::exists(dir / "config.json") ||
        !std::filesystem::exists(dir / "model.safetensors"))
      continue;
    SCOPED_TRACE(dir.string());
    ModelConfig c = load_model_config(dir);
    ModelWeights w = load_weights(c, dir);
    ASSERT_EQ(static_cast<int>(w.layers.size()), c.num_layers);
    for (int i = 0; i < c.num_layers; ++i) {
      EXPECT_EQ(w.layers[i].attn.index_q.defined(), c.attention_kinds[i] == AttentionKind::kSparse);
      EXPECT_EQ(w.layers[i].mlp.experts.size(),
                c.mlp_kinds[i] == MlpKind::kMoe ? size_t(c.num_experts) : 0u);
      for (const auto& e : w.layers[i].mlp.experts)
        EXPECT_TRUE(e.gate.defined() && e.up.defined() && e.down.defined());
    }
    ++loaded;
  }
  EXPECT_GT(loaded, 0);
}

TEST(LinearWeight, Fp8BlockDequantizeAndRows) {
  // 260 x 300: partial blocks in both dimensions.
  const int64_t out = 260, in = 300;
  LinearWeight w;
  w.name = "blocky";
  w.out_features = out;
  w.in_features = in;
  w.format = WeightFormat::kFp8Block;
  w.weight = Tensor::zeros({out, in}, DType::kF8E4M3);
  w.scale = Tensor::zeros({3, 3}, DType::kF32);
  for (int64_t i = 0; i < out * in; ++i)
    w.weight.data_as<uint8_t>()[i] = static_cast<uint8_t>((i * 37) % 126);
  for (int i = 0; i < 9; ++i) w.scale.data_as<float>()[i] = 0.5f + i;
  std::vector<float> all = dequantized(w);
  for (int64_t r : {0L, 127L, 128L, 259L})
    for (int64_t c : {0L, 127L, 128L, 299L})
      EXPECT_EQ(all[r * in + c], fp8_e4m3_decode(w.weight.data_as<uint8_t>()[r * in + c]) *
                                     w.scale.data_as<float>()[(r / 128) * 3 + c / 128]);
  LinearWeight tail = w.rows(256, 260);
  std::vector<float> got = dequantized(tail);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), all.begin() + 256 * in));
  EXPECT_THROW(w.rows(100, 200), Error);
}

}  // namespace
}  // namespace m3
