// The bytes each backend op must move at least, for bench latency's per-op floors (bytes over the
// bandwidth): the operands it reads and writes once, the weights it touches and the KV it reads.
// The step floor's assumptions (app/cmd_bench_latency.cc) hold op by op:
//  - a MoE op over `rows` tokens touches held x (1 - (1 - k/E)^rows) of its routed experts
//    (uniform routing), plus its router and (added here) shared expert;
//  - the indexer reads each sequence's whole index-K once, sparse attention min(len, topk x block)
//    tokens of K and V a KV head (a full layer every token), however many query rows;
//  - activations a fused op keeps inside (a SwiGLU's intermediate, the experts' permuted rows)
//    are not counted.
// Decode steps are what these floors are for; prefill ops are bound by FLOPs instead.
#pragma once
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"
#include "ops/weights.h"

namespace m3::app {

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

}  // namespace m3::app
