// weight_footprint: for a one-rank layout it is exactly what make_dummy_weights allocates, in
// every weight format and with ignore lists (the planner and the dummy weights agree on each
// tensor's shape and format); for a split layout each rank holds its share.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"
#include "model/weight_footprint.h"
#include "model/weights.h"
#include "tests/model_loading/small_config.h"

namespace m3 {
namespace {

using json = nlohmann::json;

int64_t bytes(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t bytes(const LinearWeight& w) { return w.defined() ? static_cast<int64_t>(w.nbytes()) : 0; }

// Every tensor the dummy weights allocated.
int64_t allocated_bytes(const ModelWeights& w, bool tied) {
  int64_t n = bytes(w.embed) + bytes(w.final_norm) + (tied ? 0 : bytes(w.lm_head));
  for (const LayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attn;
    n += bytes(l.input_norm) + bytes(l.post_attn_norm) + bytes(a.q_norm) + bytes(a.k_norm) + bytes(a.index_q_norm) +
         bytes(a.index_k_norm);
    for (const LinearWeight* x : {&a.q, &a.k, &a.v, &a.o, &a.index_q, &a.index_k, &l.mlp.gate, &l.mlp.up, &l.mlp.down})
      n += bytes(*x);
    n += bytes(l.mlp.router) + bytes(l.mlp.router_bias);
    for (const ExpertWeights& e : l.mlp.experts) n += bytes(e.gate) + bytes(e.up) + bytes(e.down);
  }
  return n;
}

RankShard one_rank(const ModelConfig& c) {
  return make_parallel_layout(ParallelConfig{}, model_geometry(c)).ranks.front();
}

class FootprintMatchesDummyWeights : public ::testing::TestWithParam<json> {};

TEST_P(FootprintMatchesDummyWeights, OneRankIsTheWholeModel) {
  const ModelConfig c = testing::small_quantized_config(GetParam());
  const ModelWeights w = make_dummy_weights(c, 1);
  EXPECT_EQ(weight_footprint(c, one_rank(c)).total(), allocated_bytes(w, c.tie_word_embeddings)) << GetParam().dump();
}

INSTANTIATE_TEST_SUITE_P(
    Formats, FootprintMatchesDummyWeights,
    ::testing::Values(json(nullptr), json{{"quant_method", "mxfp8"}},
                      json{{"quant_method", "mxfp8"},
                           {"moe_quant_algo", "NVFP4"},
                           {"moe_quant_format", "nvfp4-pack-quantized"},
                           {"ignored_layers", {"lm_head", "model.embed_tokens", "re:.*self_attn\\.o_proj$"}}},
                      json{{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}, json{{"quant_method", "fp8"}},
                      json{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}));

TEST(WeightFootprint, RanksHoldTheirShare) {
  // mxfp8 linears, nvfp4 experts: 4 experts of [96 x 256] w1/w3 and [256 x 96] w2 on 2 MoE layers.
  const ModelConfig c = testing::small_quantized_config(
      {{"quant_method", "mxfp8"}, {"moe_quant_algo", "NVFP4"}, {"moe_quant_format", "nvfp4-pack-quantized"}});
  const WeightFootprint whole = weight_footprint(c, one_rank(c));
  // nvfp4 [96, 256]: 96 x 128 codes + 96 x 16 scales = 13824; [256, 96]: 256 x 48 + 256 x 6 = 13824.
  EXPECT_EQ(whole.routed_experts, 2 * 4 * (13824 + 13824 + 13824));
  // EP 2: two whole experts per rank, everything else as on one rank.
  const ParallelLayout ep2 = make_parallel_layout(ParallelConfig{1, 2, true}, model_geometry(c));
  for (const RankShard& r : ep2.ranks) {
    const WeightFootprint f = weight_footprint(c, r);
    EXPECT_EQ(f.routed_experts, whole.routed_experts / 2);
    EXPECT_EQ(f.attention, whole.attention);
    EXPECT_EQ(f.embedding, whole.embedding);
  }
  // TP 2 cuts the dense MLP's 200 columns of down_proj into 100 per rank: not whole 1x32 mxfp8
  // scale blocks, so the plan refuses it.
  const ParallelLayout tp2 = make_parallel_layout(ParallelConfig{2, 1, false}, model_geometry(c));
  try {
    weight_footprint(c, tp2.ranks[1]);
    ADD_FAILURE() << "a cut scale block was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "language_model.model.layers.0.mlp.down_proj: a rank holds 100 of its 200 input columns, which cuts "
                 "its mxfp8 scale blocks of 32 columns; choose a -tp that keeps them whole");
  }
  // With a dense MLP of 256, TP 2 gives each rank 2 query heads, 1 KV head, 1 index head, 48
  // rows of each expert (48 = 3 nvfp4 blocks of 16) and 48 vocab rows.
  ModelConfig c256 = c;
  c256.dense_intermediate_size = 256;
  const ParallelLayout tp2_256 = make_parallel_layout(ParallelConfig{2, 1, false}, model_geometry(c256));
  const WeightFootprint half = weight_footprint(c256, tp2_256.ranks[1]);
  // nvfp4 [48, 256]: 48 x 128 + 48 x 16 = 6912; [256, 48]: 256 x 24 + 256 x 3 = 6912.
  EXPECT_EQ(half.routed_experts, 2 * 4 * 3 * 6912);
  // embed + lm_head bf16 48 x 256 x 2 each, final norm f32 256.
  EXPECT_EQ(half.embedding, 2 * 48 * 256 * 2 + 4 * 256);
  EXPECT_LT(half.attention, whole.attention);
}

}  // namespace
}  // namespace m3
