// make_dummy_weights: shapes and formats follow the config and its quantization_config, values
// dequantize to ~N(0, 1/in_features), and the bytes depend only on the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "tests/model_loading/small_config.h"

namespace m3 {
namespace {

using json = nlohmann::json;

std::vector<const LinearWeight*> all_linears(const ModelWeights& w) {
  std::vector<const LinearWeight*> out{&w.lm_head};
  for (const auto& l : w.layers) {
    for (const auto* x : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.attn.index_q,
                          &l.attn.index_k, &l.mlp.gate, &l.mlp.up, &l.mlp.down})
      if (x->defined()) out.push_back(x);
    for (const auto& e : l.mlp.experts) out.insert(out.end(), {&e.gate, &e.up, &e.down});
  }
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_shapes(const LinearWeight& w) {
  SCOPED_TRACE(w.name);
  const int64_t o = w.out_features, i = w.in_features;
  switch (w.format) {
    case WeightFormat::kDense:
      EXPECT_EQ(w.weight.shape(), (Shape{o, i}));
      break;
    case WeightFormat::kFp8:
      EXPECT_EQ(w.weight.dtype(), DType::kF8E4M3);
      EXPECT_EQ(w.scale.numel(), 1);
      break;
    case WeightFormat::kFp8Block:
      EXPECT_EQ(w.weight.dtype(), DType::kF8E4M3);
      EXPECT_EQ(w.scale.shape(), (Shape{ceil_div(o, 128), ceil_div(i, 128)}));
      break;
    case WeightFormat::kMxfp8:
      EXPECT_EQ(w.weight.shape(), (Shape{o, i}));
      EXPECT_EQ(w.scale.shape(), (Shape{o, ceil_div(i, 32)}));
      EXPECT_EQ(w.scale.dtype(), DType::kU8);
      break;
    case WeightFormat::kNvfp4:
      EXPECT_EQ(w.weight.shape(), (Shape{o, ceil_div(i, 2)}));
      EXPECT_EQ(w.weight.dtype(), DType::kU8);
      EXPECT_EQ(w.scale.shape(), (Shape{o, ceil_div(i, 16)}));
      EXPECT_EQ(w.scale.dtype(), DType::kF8E4M3);
      break;
  }
}

void check_statistics(const LinearWeight& w) {
  SCOPED_TRACE(w.name);
  std::vector<float> v(w.out_features * w.in_features);
  dequantize_rows(w, 0, w.out_features, v.data());
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x, sq += double(x) * x;
  }
  const double n = static_cast<double>(v.size()), mean = sum / n;
  const double std = std::sqrt(sq / n - mean * mean),
               target = 1.0 / std::sqrt(double(w.in_features));
  EXPECT_GT(std, target / 1.5);
  EXPECT_LT(std, target * 1.5);
  EXPECT_LT(std::fabs(mean), 0.1 * target);
}

struct Case {
  const char* label;
  json quant;
  WeightFormat linear, expert;
};

class DummyWeights : public ::testing::TestWithParam<Case> {};

TEST_P(DummyWeights, FormatsShapesStatisticsAndDeterminism) {
  const Case& k = GetParam();
  ModelConfig c = testing::small_quantized_config(k.quant);
  ModelWeights a = make_dummy_weights(c, 42);
  ASSERT_EQ(a.layers.size(), 3u);
  EXPECT_EQ(a.embed.shape(), (Shape{96, 256}));
  EXPECT_EQ(a.embed.dtype(), DType::kBF16);
  EXPECT_EQ(a.final_norm.dtype(), DType::kF32);
  EXPECT_EQ(a.lm_head.format, WeightFormat::kDense);
  EXPECT_FALSE(a.layers[0].attn.index_q.defined());
  EXPECT_TRUE(a.layers[0].mlp.experts.empty());
  EXPECT_EQ(a.layers[1].attn.index_q.out_features, 64);
  EXPECT_EQ(a.layers[1].attn.index_k.out_features, 32);
  EXPECT_EQ(a.layers[1].attn.index_q_norm.numel(), 32);
  EXPECT_EQ(a.layers[1].mlp.router.shape(), (Shape{4, 256}));
  EXPECT_EQ(a.layers[1].mlp.router_bias.shape(), (Shape{4}));
  EXPECT_EQ(a.layers[0].mlp.gate.out_features, 200);
  EXPECT_EQ(a.layers[1].mlp.gate.out_features, 64);
  ASSERT_EQ(a.layers[2].mlp.experts.size(), 4u);
  EXPECT_EQ(a.layers[2].mlp.experts[3].down.out_features, 256);
  EXPECT_EQ(a.layers[2].mlp.experts[3].down.in_features, 96);
  EXPECT_EQ(a.layers[1].attn.q.format, k.linear);
  EXPECT_EQ(a.layers[0].mlp.down.format, k.linear);
  EXPECT_EQ(a.layers[1].mlp.experts[0].up.format, k.expert);

  ModelWeights b = make_dummy_weights(c, 42);
  ModelWeights other = make_dummy_weights(c, 43);
  auto la = all_linears(a), lb = all_linears(b), lo = all_linears(other);
  ASSERT_EQ(la.size(), lb.size());
  int differing = 0;
  for (std::size_t i = 0; i < la.size(); ++i) {
    check_shapes(*la[i]);
    if (la[i]->in_features >= 64 && la[i]->out_features >= 64) check_statistics(*la[i]);
    ASSERT_EQ(la[i]->weight.nbytes(), lb[i]->weight.nbytes());
    EXPECT_EQ(std::memcmp(la[i]->weight.data(), lb[i]->weight.data(), la[i]->weight.nbytes()), 0)
        << la[i]->name;
    if (la[i]->scale.defined()) {
      EXPECT_EQ(std::memcmp(la[i]->scale.data(), lb[i]->scale.data(), la[i]->scale.nbytes()), 0);
    }
    EXPECT_EQ(la[i]->global_scale, lb[i]->global_scale);
    differing +=
        std::memcmp(la[i]->weight.data(), lo[i]->weight.data(), la[i]->weight.nbytes()) != 0;
  }
  EXPECT_EQ(differing, static_cast<int>(la.size()));  // another seed changes every tensor
  EXPECT_EQ(std::memcmp(a.embed.data(), b.embed.data(), a.embed.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Dummy, DummyWeights,
    ::testing::Values(
        Case{"bf16", nullptr, WeightFormat::kDense, WeightFormat::kDense},
        Case{"mxfp8", {{"quant_method", "mxfp8"}}, WeightFormat::kMxfp8, WeightFormat::kMxfp8},
        Case{"m31",
             {{"quant_method", "mxfp8"},
              {"moe_quant_algo", "NVFP4"},
              {"moe_quant_format", "nvfp4-pack-quantized"}},
             WeightFormat::kMxfp8,
             WeightFormat::kNvfp4},
        Case{"modelopt_nvfp4",
             {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}},
             WeightFormat::kNvfp4,
             WeightFormat::kNvfp4},
        Case{"fp8", {{"quant_method", "fp8"}}, WeightFormat::kFp8, WeightFormat::kFp8},
        Case{"fp8_block",
             {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}},
             WeightFormat::kFp8Block,
             WeightFormat::kFp8Block}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(DummyWeightsIgnore, IgnoredLayersStayUnquantized) {
  ModelConfig c =
      testing::small_quantized_config({{"quant_method", "mxfp8"}, {"ignored_layers", {"re:.*self_attn\\.o_proj$"}}});
  ModelWeights w = make_dummy_weights(c, 1);
  EXPECT_EQ(w.layers[1].attn.o.format, WeightFormat::kDense);
  EXPECT_EQ(w.layers[1].attn.q.format, WeightFormat::kMxfp8);
}

TEST(DummyWeightsTied, LmHeadIsTheEmbedding) {
  json q = nullptr;
  ModelConfig c = testing::small_quantized_config(q);
  c.tie_word_embeddings = true;
  ModelWeights w = make_dummy_weights(c, 1);
  EXPECT_EQ(w.lm_head.weight.data(), w.embed.data());
}

}  // namespace
}  // namespace m3
