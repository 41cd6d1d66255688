#include "app/op_floors.h"

#include <algorithm>
#include <cmath>

namespace m3::app {

double tensor_bytes(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; }

double weight_bytes(const LinearWeight& w) { return tensor_bytes(w.weight) + tensor_bytes(w.scale); }

double moe_bytes(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, const Tensor& out) {
  double bytes = tensor_bytes(x) + tensor_bytes(out) + tensor_bytes(mlp.router) + tensor_bytes(mlp.router_bias);
  if (params.add_shared) bytes += weight_bytes(mlp.gate) + weight_bytes(mlp.up) + weight_bytes(mlp.down);
  const size_t held = mlp.experts.size();
  if (held == 0 || params.num_experts <= 0 || !x.defined()) return bytes;
  double experts = 0;
  for (const ExpertWeights& e : mlp.experts) experts += weight_bytes(e.gate) + weight_bytes(e.up) + weight_bytes(e.down);
  const double k_over_e = std::min(1.0, double(params.experts_per_token) / params.num_experts);
  const double touched = 1.0 - std::pow(1.0 - k_over_e, static_cast<double>(x.dim(0)));
  return bytes + experts * touched;
}

namespace {

double kv_token_bytes(const KvLayerView& c) {  // K and V of every KV head
  return 2.0 * c.num_kv_heads * (kv_data_bytes(c.kv_dtype, c.head_dim) + kv_scale_bytes(c.kv_dtype, c.head_dim));
}

double index_token_bytes(const KvLayerView& c) {
  return c.index_dim > 0 ? kv_data_bytes(c.index_dtype, c.index_dim) + kv_scale_bytes(c.index_dtype, c.index_dim)
                         : 0.0;
}

}  // namespace

double kv_write_bytes(const KvLayerView& cache, int64_t tokens) {
  return static_cast<double>(tokens) * (kv_token_bytes(cache) + index_token_bytes(cache));
}

double index_read_bytes(const KvLayerView& cache, std::span<const int32_t> seq_lens) {
  double tokens = 0;
  for (int32_t len : seq_lens) tokens += len;
  return tokens * index_token_bytes(cache);
}

double attention_read_bytes(const KvLayerView& cache, std::span<const int32_t> seq_lens, int topk_blocks) {
  const bool sparse = cache.index_dim > 0;
  const int64_t selected = int64_t(topk_blocks) * cache.block_size;
  double tokens = 0;
  for (int32_t len : seq_lens) tokens += sparse ? std::min<int64_t>(len, selected) : len;
  return tokens * kv_token_bytes(cache);
}

double linear_flops(const Tensor& x, const LinearWeight& w) {
  return x.defined() ? 2.0 * x.dim(0) * double(w.in_features) * double(w.out_features) : 0.0;
}

double moe_flops(const Tensor& x, const MlpWeights& mlp, const MoeParams& params) {
  if (!x.defined()) return 0.0;
  const double rows = static_cast<double>(x.dim(0));
  double flops = mlp.router.defined() ? 2.0 * rows * double(mlp.router.numel()) : 0.0;
  if (params.add_shared && mlp.gate.defined())
    flops += linear_flops(x, mlp.gate) + linear_flops(x, mlp.up) + linear_flops(x, mlp.down);
  if (!mlp.experts.empty() && params.num_experts > 0) {
    const ExpertWeights& e = mlp.experts.front();
    const double per_choice = 2.0 * (double(e.gate.in_features) * e.gate.out_features +
                                     double(e.up.in_features) * e.up.out_features +
                                     double(e.down.in_features) * e.down.out_features);
    const double held_share = double(mlp.experts.size()) / params.num_experts;
    flops += rows * params.experts_per_token * held_share * per_choice;
  }
  return flops;
}

double indexer_flops(const KvLayerView& cache, const Tensor& index_q, std::span<const int32_t> positions) {
  if (!index_q.defined() || cache.index_dim == 0) return 0.0;
  double keys = 0;
  for (int32_t p : positions) keys += p + 1.0;
  return 2.0 * double(index_q.dim(1)) * keys;  // index_q's row: Hi x Di
}

double attention_flops(const KvLayerView& cache, const Tensor& q, int num_q_heads, std::span<const int32_t> positions,
                       int topk_blocks) {
  if (!q.defined() || num_q_heads <= 0) return 0.0;
  const bool sparse = cache.index_dim > 0;
  const int64_t selected = int64_t(topk_blocks) * cache.block_size;
  double keys = 0;
  for (int32_t p : positions) keys += sparse ? std::min<int64_t>(p + 1, selected) : p + 1;
  return 4.0 * double(q.dim(1)) * keys;  // q's row: Hq x D
}

}  // namespace m3::app
