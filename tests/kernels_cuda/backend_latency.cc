// Decode step latency of the whole graph on the CUDA backend at the M3.1 shape: dummy weights in
// the release formats (MXFP8 attention and shared expert, NVFP4 routed experts, bf16 lm_head), a
// few layers (every one sparse + MoE, the 57 of 60 that dominate), nvfp4 KV and index caches,
// one query token per request at the given context. The cache holds zeros (no prefill): the
// bytes read and the work done are those of a real step. Per layer: (step - lm_head) / layers,
// against the byte floor of one MoE layer (docs/gpu-backend-notes.md) at 4.2 TB/s.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "model/config.h"
#include "model/minimax_m3.h"
#include "model/weights.h"
#include "tests/kernels_cuda/backend_checks.h"

namespace m3::test {
namespace {

// One decode step: `batch` requests of `context` tokens (the last one new), disjoint pages.
StepBatch decode_step(int batch, int context, int block_size) {
  StepBatch b;
  const int pages = (context + block_size - 1) / block_size;
  b.pages_per_seq = pages;
  b.query_start.push_back(0);
  for (int s = 0; s < batch; ++s) {
    const int pos = context - 1;
    b.token_ids.push_back((s * 7919 + 11) % 200000);
    b.positions.push_back(pos);
    b.token_seq.push_back(s);
    b.seq_lens.push_back(context);
    for (int p = 0; p < pages; ++p) b.page_table.push_back(s * pages + p);
    b.slot_mapping.push_back((s * pages + pos / block_size) * block_size + pos % block_size);
    b.logits_rows.push_back(s);
    b.query_start.push_back(s + 1);
  }
  return b;
}

// Bytes one MoE layer of M3.1 reads in a decode step of `batch` requests at `context`.
double layer_floor_bytes(const ModelConfig& c, int batch, int context) {
  const double h = c.hidden_size, mx = 1.0 + 1.0 / 32, fp4 = 0.5 + 1.0 / 16;
  const double attn = (double(c.num_heads) * c.head_dim * h * 2 + 2.0 * c.num_kv_heads * c.head_dim * h) * mx;
  const double index = (double(c.index_heads) * c.index_head_dim + c.index_head_dim) * h * mx;
  const double router = double(c.num_experts) * h * 4;
  const double shared = 3.0 * c.shared_intermediate_size * h * mx;
  const double expert = 3.0 * c.moe_intermediate_size * h * fp4;
  const double distinct =
      c.num_experts * (1.0 - std::pow(1.0 - double(c.experts_per_token) / c.num_experts, batch));
  const double selected = std::min<double>(context, double(c.index_topk_blocks) * c.index_block_size);
  const double kv = batch * (context * 72.0 + selected * c.num_kv_heads * 144.0);
  return attn + index + router + shared + distinct * expert + kv;
}

}  // namespace

void run_latency(const std::string& config_path, int layers, const std::string& only_case) {
  std::ifstream f(config_path);
  M3_CHECK(f.good(), "cannot open {}", config_path);
  ModelConfig config = parse_model_config(nlohmann::json::parse(f), config_path);
  override_num_layers(config, layers);
  for (auto& k : config.attention_kinds) k = AttentionKind::kSparse;
  for (auto& k : config.mlp_kinds) k = MlpKind::kMoe;

  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Backend> backend = make_cuda_backend();
  const double copy_bytes_per_second = backend->measure_copy_rate(int64_t{1} << 28, 10);  // the floor's rate
  std::printf("floors at this GPU's copy rate: %.2f TB/s (a device-to-device copy)\n",
              copy_bytes_per_second / 1e12);
  ModelWeights weights = place_weights(make_dummy_weights(config, 1), *backend);
  const LinearWeight lm_head = weights.lm_head;
  std::printf("dummy M3.1 weights, %d layers: %.1f s to build and upload\n", layers,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  struct Case {
    int context, batch;
  };
  std::vector<Case> cases = {{8192, 1},   {8192, 8},    {8192, 32},   {8192, 64},
                             {8192, 128}, {131072, 1}, {131072, 8}, {131072, 32}};
  if (!only_case.empty()) {  // "CONTEXTxBATCH", e.g. 8192x1 (profiling one shape)
    const size_t x = only_case.find('x');
    M3_CHECK(x != std::string::npos, "--case {}: expected CONTEXTxBATCH, e.g. 8192x1", only_case);
    cases = {{std::stoi(only_case.substr(0, x)), std::stoi(only_case.substr(x + 1))}};
  }
  int64_t max_blocks = 0;
  for (const Case& c : cases)
    max_blocks = std::max<int64_t>(max_blocks, int64_t(c.batch) * ((c.context + 127) / 128));

  ModelRuntimeOptions o;
  o.activation_dtype = DType::kBF16;
  o.kv_dtype = KvDType::kNVFP4;
  o.index_dtype = KvDType::kNVFP4;
  o.num_kv_blocks = max_blocks;
  MiniMaxM3 model(config, std::move(weights), *backend, o);
  std::printf("%8s %6s %10s %10s %12s %12s %8s\n", "context", "batch", "step ms", "lm_head ms", "layer us",
              "floor us", "x floor");
  for (const Case& c : cases) {
    const StepBatch b = decode_step(c.batch, c.context, model.block_size());
    std::vector<float> logits(size_t(c.batch) * config.vocab_size);
    for (int i = 0; i < 2; ++i) model.forward(b, logits.data());
    const int iters = 5;
    auto s0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) model.forward(b, logits.data());
    const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count() / iters;
    // The head alone, on rows of the same count.
    Tensor x = backend->alloc({c.batch, config.hidden_size}, DType::kBF16);
    Tensor y = backend->alloc({c.batch, config.vocab_size}, DType::kBF16);
    backend->linear(x, lm_head, y);
    cuda::check_cuda(cudaDeviceSynchronize(), "lm_head warmup");
    s0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) backend->linear(x, lm_head, y);
    cuda::check_cuda(cudaDeviceSynchronize(), "lm_head");
    const double head_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count() / iters;
    const double layer_us = (step_ms - head_ms) * 1e3 / layers;
    const double floor_us = layer_floor_bytes(config, c.batch, c.context) / copy_bytes_per_second * 1e6;
    std::printf("%8d %6d %10.3f %10.3f %12.1f %12.1f %8.2f\n", c.context, c.batch, step_ms, head_ms, layer_us,
                floor_us, layer_us / floor_us);
    std::fflush(stdout);
  }
}

}  // namespace m3::test
