// What each backend op must do at least, for bench latency's per-op floors: the bytes it moves
// (over the bandwidth: decode) and the FLOPs of its products (over the tensor peak: prefill).
// Bytes: the operands it reads and writes once, the weights it touches and the KV it reads.
// FLOPs: 2 per multiply-add of its matrix products, as the prefill floor counts them; norms,
// RoPE, softmax and routing's top-k count nothing.
// The step floors' assumptions (app/cmd_bench_latency.cc) hold op by op:
//  - a MoE op over `rows` tokens touches held x (1 - (1 - k/E)^rows) of its routed experts
//    (uniform routing), plus its router and (added here) shared expert;
//  - the indexer reads each sequence's whole index-K once, sparse attention min(len, topk x block)
//    tokens of K and V a KV head (a full layer every token), however many query rows;
//  - activations a fused op keeps inside (a SwiGLU's intermediate, the experts' permuted rows)
//    are not counted.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"
#include "ops/weights.h"

namespace m3::app {

struct OpWork {
  double bytes = 0;
  double flops = 0;
};

double tensor_bytes(const Tensor& t);  // 0 for an undefined tensor
double weight_bytes(const LinearWeight& w);  // codes and scales
double moe_bytes(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, const Tensor& out);
// The K, V and index-K rows `tokens` new tokens write to one layer.
double kv_write_bytes(const KvLayerView& cache, int64_t tokens);
// One layer's index-K of every sequence (seq_lens: the step's sequence lengths, new tokens included).
double index_read_bytes(const KvLayerView& cache, std::span<const int32_t> seq_lens);
// One layer's K and V read by attention: min(len, topk_blocks x block) tokens a sequence on a
// sparse layer (cache.index_dim > 0), every token on a full one.
double attention_read_bytes(const KvLayerView& cache, std::span<const int32_t> seq_lens, int topk_blocks);

// 2 x rows x in x out: w over x's rows (x: any tensor of that many rows, e.g. the MLP's input for
// its down projection).
double linear_flops(const Tensor& x, const LinearWeight& w);
// Router, the expected share of the routed experts this rank holds (k of E a token), and the
// shared expert when added.
double moe_flops(const Tensor& x, const MlpWeights& mlp, const MoeParams& params);
// positions: the step's query positions (one a row of x / q). The indexer scores every key up to
// a row's position with each index head (2 Hi Di (p + 1)); attention multiplies QK and PV over the
// keys a row attends (4 Hq D keys: min(p + 1, topk x block) on a sparse layer, p + 1 on a full one).
double indexer_flops(const KvLayerView& cache, const Tensor& index_q, std::span<const int32_t> positions);
double attention_flops(const KvLayerView& cache, const Tensor& q, int num_q_heads, std::span<const int32_t> positions,
                       int topk_blocks);

}  // namespace m3::app
