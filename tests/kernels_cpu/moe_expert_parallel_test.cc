// The MoE op's expert-parallel and routed-only contracts (ops/backend.h MoeParams) on the CPU
// reference, which the CUDA backend is measured against:
//  - expert parallel: over any partition of the experts into ranks' slices, the routed-only
//    outputs of the slices (each rank given only its experts' weights) sum, in fp32, to the
//    all-experts routed-only output within fp32 rounding, and every slice contributes;
//  - routed only: add_shared = false, then the shared expert's swiglu_mlp added with add_inplace,
//    equals the default output bit for bit, in float32 and in bfloat16 activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/bf16.h"
#include "kernels/cpu/cpu_backend.h"
#include "ops/backend.h"
#include "ops/weights.h"

namespace m3 {
namespace {

constexpr int kHidden = 64, kInter = 32;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

LinearWeight random_weight(std::mt19937& rng, const std::string& name, int64_t out, int64_t in) {
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(float(in)));
  LinearWeight w;
  w.name = name;
  w.out_features = out;
  w.in_features = in;
  w.weight = Tensor::zeros({out, in}, DType::kF32);
  for (float& v : w.weight.span<float>()) v = bf16_round(dist(rng));
  return w;
}

struct MoeLayer {
  int experts = 0, top_k = 0;
  MlpWeights mlp;  // all experts
};

MoeLayer random_layer(int experts, int top_k, uint32_t seed) {
  std::mt19937 rng(seed);
  MoeLayer l{experts, top_k, {}};
  l.mlp.gate = random_weight(rng, "shared.gate", kInter, kHidden);
  l.mlp.up = random_weight(rng, "shared.up", kInter, kHidden);
  l.mlp.down = random_weight(rng, "shared.down", kHidden, kInter);
  std::normal_distribution<float> router(0.0f, 0.15f);
  l.mlp.router = Tensor::zeros({experts, kHidden}, DType::kF32);
  for (float& v : l.mlp.router.span<float>()) v = router(rng);
  l.mlp.router_bias = Tensor::zeros({experts}, DType::kF32);
  for (int e = 0; e < experts; ++e) l.mlp.router_bias.data_as<float>()[e] = 0.02f * float(e % 3);
  for (int e = 0; e < experts; ++e)
    l.mlp.experts.push_back({random_weight(rng, "e.gate", kInter, kHidden), random_weight(rng, "e.up", kInter, kHidden),
                             random_weight(rng, "e.down", kHidden, kInter)});
  return l;
}

std::unique_ptr<Backend> cpu_backend(DType activations) {
  std::unique_ptr<Backend> b = make_cpu_backend();
  BackendConfig config;
  config.activation_dtype = activations;
  config.num_q_heads = 1;
  config.num_kv_heads = 1;
  config.head_dim = kHidden;
  config.block_size = 16;
  b->configure(config);
  return b;
}

Tensor random_x(Backend& b, int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor x = b.alloc({rows, kHidden}, b.activation_storage_dtype());
  for (float& v : x.span<float>()) v = bf16_round(dist(rng));  // exact in either activation dtype
  return x;
}

MoeParams params_of(const MoeLayer& l, int first, bool add_shared) {
  MoeParams p;
  p.num_experts = l.experts;
  p.experts_per_token = l.top_k;
  p.routed_scaling_factor = 2.5f;
  p.swiglu_alpha = kAlpha;
  p.swiglu_limit = kLimit;
  p.first_expert = first;
  p.add_shared = add_shared;
  return p;
}

// The op on a rank holding experts [first, first + count): the loader gives it only their weights
// and no shared expert when the op is routed only.
std::vector<float> run_moe(Backend& b, const MoeLayer& l, const Tensor& x, int first, int count, bool add_shared) {
  MlpWeights mlp;
  if (add_shared) {
    mlp.gate = l.mlp.gate;
    mlp.up = l.mlp.up;
    mlp.down = l.mlp.down;
  }
  mlp.router = l.mlp.router;
  mlp.router_bias = l.mlp.router_bias;
  mlp.experts.assign(l.mlp.experts.begin() + first, l.mlp.experts.begin() + first + count);
  Tensor out = b.alloc({x.dim(0), kHidden}, b.activation_storage_dtype());
  b.moe(x, mlp, params_of(l, first, add_shared), out);
  const auto values = out.span<float>();
  return {values.begin(), values.end()};
}

using Partition = std::vector<std::pair<int, int>>;  // [first, first + count) per rank

struct Shape {
  int experts, top_k;
  std::vector<Partition> partitions;
};

const Shape kShapes[] = {
    {8, 2,
     {{{0, 4}, {4, 4}},
      {{0, 3}, {3, 1}, {4, 4}},
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}}}},
    {16, 4, {{{0, 8}, {8, 8}}, {{0, 5}, {5, 6}, {11, 5}}, {{0, 4}, {4, 4}, {8, 4}, {12, 4}}}},
    {128, 4, {{{0, 32}, {32, 32}, {64, 32}, {96, 32}}}},
};
const int kRowCounts[] = {1, 7, 64, 300};

TEST(MoeExpertParallel, SlicesOfRoutedOnlySumToAllExperts) {
  std::unique_ptr<Backend> b = cpu_backend(DType::kF32);
  for (const Shape& s : kShapes) {
    const MoeLayer layer = random_layer(s.experts, s.top_k, 11u + uint32_t(s.experts));
    for (int rows : kRowCounts) {
      const Tensor x = random_x(*b, rows, 101u + uint32_t(rows));
      const std::vector<float> all = run_moe(*b, layer, x, 0, s.experts, /*add_shared=*/false);
      float scale = 0.0f;
      for (float v : all) scale = std::max(scale, std::fabs(v));
      ASSERT_GT(scale, 0.0f) << "E" << s.experts << " rows " << rows << ": routed output all zero";
      // A few ulps of the largest value per add: k weighted terms, then one add per slice.
      const float tol = 8.0f * FLT_EPSILON * scale * float(s.top_k + 8);
      for (const Partition& part : s.partitions) {
        std::vector<std::vector<float>> slices;
        for (const auto& [first, count] : part) slices.push_back(run_moe(*b, layer, x, first, count, false));
        std::vector<float> sum(all.size(), 0.0f);
        for (const std::vector<float>& slice : slices)
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += slice[i];
        float err = 0.0f;
        for (size_t i = 0; i < sum.size(); ++i) err = std::max(err, std::fabs(sum[i] - all[i]));
        EXPECT_LE(err, tol) << "E" << s.experts << " k" << s.top_k << " rows " << rows << ", " << part.size()
                            << " slices";
        // Every slice contributes (64 tokens choose some expert of each slice: the sum is not
        // one slice's output alone).
        if (rows < 64) continue;
        for (size_t j = 0; j < slices.size(); ++j)
          EXPECT_TRUE(std::any_of(slices[j].begin(), slices[j].end(), [](float v) { return v != 0.0f; }))
              << "E" << s.experts << " rows " << rows << ": slice " << j << " adds nothing";
      }
    }
  }
}

// What data-parallel attention does: the routed experts without the shared one, whose output the
// token's own rank adds afterwards.
TEST(MoeExpertParallel, RoutedOnlyPlusSharedExpertIsTheDefault) {
  for (DType activations : {DType::kF32, DType::kBF16}) {
    std::unique_ptr<Backend> b = cpu_backend(activations);
    for (const Shape& s : kShapes) {
      const MoeLayer layer = random_layer(s.experts, s.top_k, 29u + uint32_t(s.experts));
      for (int rows : kRowCounts) {
        const Tensor x = random_x(*b, rows, 203u + uint32_t(rows));
        // All experts, and one rank of expert parallel (the last slice of the first partition).
        const auto [last_first, last_count] = s.partitions.front().back();
        for (const auto& [first, count] : {std::pair{0, s.experts}, std::pair{last_first, last_count}}) {
          const std::vector<float> want = run_moe(*b, layer, x, first, count, /*add_shared=*/true);
          const std::vector<float> routed = run_moe(*b, layer, x, first, count, /*add_shared=*/false);
          Tensor got = b->alloc({rows, kHidden}, b->activation_storage_dtype());
          std::copy(routed.begin(), routed.end(), got.span<float>().begin());
          Tensor shared = b->alloc({rows, kHidden}, b->activation_storage_dtype());
          b->swiglu_mlp(x, layer.mlp.gate, layer.mlp.up, layer.mlp.down, kAlpha, kLimit, shared);
          b->add_inplace(got, shared);
          const auto g = got.span<float>();
          size_t differing = 0;
          for (size_t i = 0; i < want.size(); ++i) differing += g[i] != want[i];
          EXPECT_EQ(differing, 0u) << dtype_name(activations) << " E" << s.experts << " experts [" << first << ", "
                                   << first + count << ") rows " << rows;
          // The shared expert does contribute: routed only is not the default.
          size_t same = 0;
          for (size_t i = 0; i < want.size(); ++i) same += routed[i] == want[i];
          EXPECT_LT(same, want.size());
        }
      }
    }
  }
}

}  // namespace
}  // namespace m3
