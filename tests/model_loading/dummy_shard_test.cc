// make_dummy_shard: every rank's dummy weights, built alone, are byte for byte the slices
// shard_weights cuts from the whole make_dummy_weights model (weights, scales, scalar fields,
// vocabulary padding, a tied head's shared buffer), in every format and layout; a slice off by
// one row or column is told apart; the whole model's bytes do not depend on the thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/dummy_shard.h"
#include "model/weight_footprint.h"
#include "model/weight_shard.h"
#include "model/weights.h"
#include "parallel/layout.h"
#include "tests/model_loading/small_config.h"

namespace m3 {
namespace {

using json = nlohmann::json;

void tensor_differences(const std::string& what, const Tensor& a, const Tensor& b, std::vector<std::string>& out) {
  if (a.defined() != b.defined()) {
    out.push_back(what + ": defined in one only");
  } else if (!a.defined()) {
    return;
  } else if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    out.push_back(what + ": " + std::string(dtype_name(a.dtype())) + " " + shape_string(a.shape()) + " vs " +
                  std::string(dtype_name(b.dtype())) + " " + shape_string(b.shape()));
  } else if (std::memcmp(a.data(), b.data(), a.nbytes()) != 0) {
    out.push_back(what + ": bytes differ");
  }
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void linear_differences(const std::string& what, const LinearWeight& a, const LinearWeight& b,
                        std::vector<std::string>& out) {
  const std::string w = what + " (" + b.name + ")";
  if (a.name != b.name) out.push_back(w + ": named " + a.name);
  if (a.out_features != b.out_features || a.in_features != b.in_features)
    out.push_back(w + ": [" + std::to_string(a.out_features) + ", " + std::to_string(a.in_features) + "] vs [" +
                  std::to_string(b.out_features) + ", " + std::to_string(b.in_features) + "]");
  if (a.format != b.format) out.push_back(w + ": format " + std::string(weight_format_name(a.format)));
  if (!same_bits(a.global_scale, b.global_scale) || !same_bits(a.global_divisor, b.global_divisor) ||
      !same_bits(a.input_scale, b.input_scale))
    out.push_back(w + ": scalar fields differ");
  tensor_differences(w + " weight", a.weight, b.weight, out);
  tensor_differences(w + " scale", a.scale, b.scale, out);
}

// Every way `a` is not bitwise `b`, tensor by tensor ("layer 1 experts[2].down (...) weight:
// bytes differ"); empty when they are the same.
std::vector<std::string> differences(const ModelWeights& a, const ModelWeights& b) {
  std::vector<std::string> out;
  tensor_differences("embed", a.embed, b.embed, out);
  tensor_differences("final_norm", a.final_norm, b.final_norm, out);
  linear_differences("lm_head", a.lm_head, b.lm_head, out);
  if ((a.lm_head.weight.data() == a.embed.data()) != (b.lm_head.weight.data() == b.embed.data()))
    out.push_back("lm_head: shares the embedding's buffer in one only");
  if (a.layers.size() != b.layers.size()) {
    out.push_back("layers: " + std::to_string(a.layers.size()) + " vs " + std::to_string(b.layers.size()));
    return out;
  }
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    const std::string L = "layer " + std::to_string(i) + " ";
    tensor_differences(L + "input_norm", x.input_norm, y.input_norm, out);
    tensor_differences(L + "post_attn_norm", x.post_attn_norm, y.post_attn_norm, out);
    linear_differences(L + "q", x.attn.q, y.attn.q, out);
    linear_differences(L + "k", x.attn.k, y.attn.k, out);
    linear_differences(L + "v", x.attn.v, y.attn.v, out);
    linear_differences(L + "o", x.attn.o, y.attn.o, out);
    tensor_differences(L + "q_norm", x.attn.q_norm, y.attn.q_norm, out);
    tensor_differences(L + "k_norm", x.attn.k_norm, y.attn.k_norm, out);
    linear_differences(L + "index_q", x.attn.index_q, y.attn.index_q, out);
    linear_differences(L + "index_k", x.attn.index_k, y.attn.index_k, out);
    tensor_differences(L + "index_q_norm", x.attn.index_q_norm, y.attn.index_q_norm, out);
    tensor_differences(L + "index_k_norm", x.attn.index_k_norm, y.attn.index_k_norm, out);
    linear_differences(L + "gate", x.mlp.gate, y.mlp.gate, out);
    linear_differences(L + "up", x.mlp.up, y.mlp.up, out);
    linear_differences(L + "down", x.mlp.down, y.mlp.down, out);
    tensor_differences(L + "router", x.mlp.router, y.mlp.router, out);
    tensor_differences(L + "router_bias", x.mlp.router_bias, y.mlp.router_bias, out);
    if (x.mlp.experts.size() != y.mlp.experts.size()) {
      out.push_back(L + "experts: " + std::to_string(x.mlp.experts.size()) + " vs " +
                    std::to_string(y.mlp.experts.size()));
      continue;
    }
    for (std::size_t e = 0; e < x.mlp.experts.size(); ++e) {
      const std::string X = L + "experts[" + std::to_string(e) + "].";
      linear_differences(X + "gate", x.mlp.experts[e].gate, y.mlp.experts[e].gate, out);
      linear_differences(X + "up", x.mlp.experts[e].up, y.mlp.experts[e].up, out);
      linear_differences(X + "down", x.mlp.experts[e].down, y.mlp.experts[e].down, out);
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

int64_t expert_count(const ModelWeights& w) {
  int64_t n = 0;
  for (const LayerWeights& l : w.layers) n += static_cast<int64_t>(l.mlp.experts.size());
  return n;
}

struct QuantCase {
  const char* label;
  json quant;
};

const std::vector<QuantCase>& quant_cases() {
  static const std::vector<QuantCase> cases = {
      {"bf16", nullptr},
      {"m31_mxfp8_nvfp4",
       {{"quant_method", "mxfp8"}, {"moe_quant_algo", "NVFP4"}, {"moe_quant_format", "nvfp4-pack-quantized"}}},
      {"m31_with_ignore_list",
       {{"quant_method", "mxfp8"},
        {"moe_quant_algo", "NVFP4"},
        {"moe_quant_format", "nvfp4-pack-quantized"},
        {"ignored_layers", {"lm_head", "re:.*self_attn\\.o_proj$", "re:.*shared_experts.*"}}}},
      {"modelopt_nvfp4", {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}},
      {"fp8", {{"quant_method", "fp8"}}},
      {"fp8_block", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}};
  return cases;
}

struct LayoutCase {
  const char* label;
  ParallelConfig parallel;
};

const std::vector<LayoutCase>& layout_cases() {
  static const std::vector<LayoutCase> cases = {
      {"tp1", {1, 1, false}},    {"tp2", {2, 1, false}},         {"tp4", {4, 1, false}},
      {"tp2_ep2", {2, 1, true}}, {"tp4_ep4", {4, 1, true}},      {"dp2_ep2", {1, 2, true}},
      {"dp4_ep4", {1, 4, true}}, {"tp2_dp2_ep4", {2, 2, true}}};
  return cases;
}

class DummyShard : public ::testing::TestWithParam<std::tuple<QuantCase, LayoutCase>> {};

// On the config whose sizes split in every format (vocabulary 1001: -tp 2 and 4 pad it), every
// rank's shard is the cut of the whole model, holds only its experts and weighs its footprint.
TEST_P(DummyShard, IsBitwiseTheSliceOfTheWholeModel) {
  const auto& [quant, parallel] = GetParam();
  const ModelConfig c = testing::shard_test_config(quant.quant);
  const ModelWeights full = make_dummy_weights(c, 7);
  const ParallelLayout layout = make_parallel_layout(parallel.parallel, model_geometry(c));
  for (const RankShard& s : layout.ranks) {
    SCOPED_TRACE(::testing::Message() << "rank " << s.rank);
    const ModelWeights mine = make_dummy_shard(c, 7, s);
    const std::vector<std::string> diff = differences(mine, shard_weights(full, c, s));
    EXPECT_TRUE(diff.empty()) << joined(diff);
    EXPECT_EQ(expert_count(mine), s.experts.size * c.num_moe_layers());
    EXPECT_EQ(mine.embed.dim(0), s.vocab.size);
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndLayouts, DummyShard,
                         ::testing::Combine(::testing::ValuesIn(quant_cases()), ::testing::ValuesIn(layout_cases())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).label) + "_" + std::get<1>(info.param).label;
                         });

// The small model's odd sizes (heads of 64, intermediates of 200, 96 and 64, vocabulary 96) cut
// bf16 and fp8 columns in the middle of a draw (down_proj columns at 100, 48, 24, 16): where
// shard_weights accepts a layout the shards agree with it, and where it refuses one so does
// make_dummy_shard.
TEST(DummyShardOddSizes, AgreesWithShardWeightsOrRefusesWithIt) {
  int compared = 0, refused = 0;
  for (const QuantCase& q : quant_cases()) {
    const ModelConfig c = testing::small_quantized_config(q.quant);
    const ModelWeights full = make_dummy_weights(c, 3);
    for (const LayoutCase& p : layout_cases()) {
      const ParallelLayout layout = make_parallel_layout(p.parallel, model_geometry(c));
      for (const RankShard& s : layout.ranks) {
        SCOPED_TRACE(::testing::Message() << q.label << " " << p.label << " rank " << s.rank);
        ModelWeights cut;
        try {
          cut = shard_weights(full, c, s);
        } catch (const Error&) {
          EXPECT_THROW(make_dummy_shard(c, 3, s), Error);
          ++refused;
          continue;
        }
        const std::vector<std::string> diff = differences(make_dummy_shard(c, 3, s), cut);
        EXPECT_TRUE(diff.empty()) << joined(diff);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 50);
  EXPECT_GT(refused, 10);
}

// A tied head is the shard's embedding rows, padded, as shard_weights keeps it.
TEST(DummyShardTied, HeadSharesTheEmbeddingRows) {
  ModelConfig c = testing::shard_test_config(nullptr);
  c.tie_word_embeddings = true;
  const ModelWeights full = make_dummy_weights(c, 5);
  for (const RankShard& s : make_parallel_layout({4, 1, false}, model_geometry(c)).ranks) {
    const ModelWeights mine = make_dummy_shard(c, 5, s);
    EXPECT_EQ(mine.lm_head.weight.data(), mine.embed.data());
    const std::vector<std::string> diff = differences(mine, shard_weights(full, c, s));
    EXPECT_TRUE(diff.empty()) << "rank " << s.rank << joined(diff);
  }
}

// A vocabulary of 5 over 4 ranks pads to 8: the last rank holds two zero rows and nothing drawn.
TEST(DummyShardPadding, RankOfPaddingOnly) {
  const ModelConfig c = testing::shard_test_config(nullptr, 5);
  const RankShard s = make_parallel_layout({4, 1, false}, model_geometry(c)).ranks[3];
  const ModelWeights mine = make_dummy_shard(c, 9, s);
  EXPECT_TRUE(differences(mine, shard_weights(make_dummy_weights(c, 9), c, s)).empty());
  ASSERT_EQ(mine.embed.shape(), (Shape{2, c.hidden_size}));
  for (const uint16_t v : mine.embed.span<uint16_t>()) ASSERT_EQ(v, 0);
}

// The comparison tells a slice off by one row or one column apart, naming the tensor: the shard
// of a rank whose dense intermediate (bf16: no grid) or vocabulary starts one later is not the
// cut of the whole model at the true slice; neither is another seed.
TEST(DummyShardComparison, OffByOneAndOtherSeedsDiffer) {
  const ModelConfig c = testing::shard_test_config(nullptr);
  const ModelWeights full = make_dummy_weights(c, 7);
  const RankShard s = make_parallel_layout({2, 1, false}, model_geometry(c)).ranks[0];
  const ModelWeights truth = shard_weights(full, c, s);
  ASSERT_TRUE(differences(make_dummy_shard(c, 7, s), truth).empty());

  RankShard rows = s;
  rows.dense_intermediate.begin += 1;  // gate/up one row down, down_proj one column right
  const std::vector<std::string> d = differences(make_dummy_shard(c, 7, rows), truth);
  ASSERT_EQ(d.size(), 3u) << joined(d);
  EXPECT_EQ(d[0], "layer 0 gate (language_model.model.layers.0.mlp.gate_proj) weight: bytes differ");
  EXPECT_EQ(d[1], "layer 0 up (language_model.model.layers.0.mlp.up_proj) weight: bytes differ");
  EXPECT_EQ(d[2], "layer 0 down (language_model.model.layers.0.mlp.down_proj) weight: bytes differ");

  RankShard vocab = s;
  vocab.vocab.begin += 1;
  const std::vector<std::string> v = differences(make_dummy_shard(c, 7, vocab), truth);
  ASSERT_EQ(v.size(), 2u) << joined(v);
  EXPECT_EQ(v[0], "embed: bytes differ");
  EXPECT_EQ(v[1], "lm_head (lm_head) weight: bytes differ");

  EXPECT_FALSE(differences(make_dummy_shard(c, 8, s), truth).empty());
}

// A rank whose slice cuts a scale block (mxfp8 down_proj of 200 columns at -tp 2: a bound at
// 100 in 32-column blocks) is refused with the tensor and the block named, as shard_weights does.
TEST(DummyShardErrors, SliceThatCutsAScaleBlock) {
  ModelConfig c = testing::shard_test_config({{"quant_method", "mxfp8"}});
  c.dense_intermediate_size = 200;
  const RankShard s = make_parallel_layout({2, 1, false}, model_geometry(c)).ranks[1];
  try {
    make_dummy_shard(c, 1, s);
    ADD_FAILURE() << "a cut scale block was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "language_model.model.layers.0.mlp.down_proj: column bound 100 of [100, 200) cuts a mxfp8 scale "
                 "block of 32 columns (bounds must be multiples of 32 or in_features 200)");
  }
  RankShard past = make_parallel_layout({2, 1, true}, model_geometry(c)).ranks[1];
  past.experts.size = 3;  // experts [2, 5) of 4
  EXPECT_THROW(make_dummy_shard(c, 1, past), Error);
}

// The bytes depend on the seed only: one fill thread or many give the same model.
TEST(DummyWeightsThreads, OneThreadOrManyGiveTheSameBytes) {
  for (const QuantCase& q : quant_cases()) {
    SCOPED_TRACE(q.label);
    const ModelConfig c = testing::shard_test_config(q.quant);
    const std::vector<std::string> diff = differences(make_dummy_weights(c, 11, 1), make_dummy_weights(c, 11, 7));
    EXPECT_TRUE(diff.empty()) << joined(diff);
  }
}

}  // namespace
}  // namespace m3
