#include "app/op_bytes.h"

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

}  // namespace m3::app
