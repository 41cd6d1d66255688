// MoE at the M3.1 shape (hidden 6144, 128 NVFP4 experts of intermediate 3072, top-4, MXFP8
// shared expert, fp32 router), decode sizes and one 8192-token prefill chunk: each kernel of the op timed with CUDA events against the
// bytes it must read, then the whole backend op (host-timed, and with events on the backend's
// stream). The kernels are launched here one after the other on one stream as CudaBackend::moe
// launches them (same launchers, same work items); the op runs the shared expert on a second
// stream beside the routing and routed experts, so it takes less than their sum. Above 64-row
// items the routed gate/up step includes the copy of the routed rows into permuted order (the
// GEMM then reads them by TMA).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "ops/backend.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/backend_testing.h"
#include "tests/kernels_cuda/bench_weights.h"

namespace m3::test {
namespace {

using cuda::check_cuda;
using cuda::detail::WeightView;

constexpr int kHidden = 6144, kInter = 3072, kExperts = 128, kTopK = 4;

struct Scratch {
  cuda::DeviceBuffer logits, choice_expert, choice_weight, choice_row, row_token, counts, items, num_items, act, y,
      shared_act, shared, out, table;
};

}  // namespace

void run_moe_bench(const std::vector<int>& token_counts) {
  std::mt19937_64 rng(11);
  auto backend = make_cuda_backend();
  // The "x floor" columns: bytes at this GPU's copy rate, measured now.
  const double copy_bytes_per_us = backend->measure_copy_rate(int64_t{1} << 28, 10) / 1e6;
  std::printf("floors at this GPU's copy rate: %.2f TB/s (a device-to-device copy)\n", copy_bytes_per_us / 1e6);
  configure(*backend, {"moe bench", kHidden, 64, 4, 128, 4, 128, 128, 16, 1, 0, 64});
  MlpWeights mlp;
  mlp.gate = constant_weight(kInter, kHidden, WeightFormat::kMxfp8);
  mlp.up = constant_weight(kInter, kHidden, WeightFormat::kMxfp8);
  mlp.down = constant_weight(kHidden, kInter, WeightFormat::kMxfp8);
  for (int e = 0; e < kExperts; ++e) {
    ExpertWeights ex;
    ex.gate = constant_weight(kInter, kHidden, WeightFormat::kNvfp4);
    ex.up = constant_weight(kInter, kHidden, WeightFormat::kNvfp4);
    ex.down = constant_weight(kHidden, kInter, WeightFormat::kNvfp4);
    mlp.experts.push_back(std::move(ex));
  }
  {
    Tensor router = Tensor::zeros({kExperts, kHidden}, DType::kF32);
    const std::vector<float> r = random_values(rng, size_t(kExperts) * kHidden, 0.02f);
    std::copy(r.begin(), r.end(), router.data_as<float>());
    mlp.router = to_device(router);
  }
  MoeParams params;
  params.num_experts = kExperts;
  params.experts_per_token = kTopK;
  params.routed_scaling_factor = 2.5f;

  std::vector<WeightView> host_table(3 * kExperts);
  for (int e = 0; e < kExperts; ++e) {
    host_table[e] = view_of(mlp.experts[e].gate);
    host_table[kExperts + e] = view_of(mlp.experts[e].up);
    host_table[2 * kExperts + e] = view_of(mlp.experts[e].down);
  }
  const double expert_gate_up_bytes = double(2 * mlp.experts[0].gate.nbytes());
  const double expert_down_bytes = double(mlp.experts[0].down.nbytes());
  const double shared_gate_up_bytes = double(mlp.gate.nbytes() + mlp.up.nbytes());
  const double shared_down_bytes = double(mlp.down.nbytes());
  const double router_bytes = double(mlp.router.nbytes());

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "bench stream");
  constexpr int kSteps = 7;
  const char* step_names[kSteps - 1] = {"shared gate/up+swiglu", "shared down", "route (router,topk,scan)",
                                        "experts gate/up+swiglu", "experts down", "combine"};
  cudaEvent_t ev[kSteps];
  for (cudaEvent_t& e : ev) check_cuda(cudaEventCreate(&e), "bench event");

  std::printf("\nMoE, M3.1 shape (128 nvfp4 experts x top-4, mxfp8 shared expert): us and GB/s of the\n"
              "bytes each kernel must read (weights as stored + activations), floor at 4.2 TB/s; TFLOP/s of the\n"
              "GEMMs (8192 tokens: a prefill chunk)\n");
  std::printf("%6s %-24s %9s %9s %9s %9s %9s\n", "tokens", "kernel", "us", "MB", "GB/s", "x floor", "TFLOP/s");
  Scratch s;
  for (int tokens : token_counts.empty() ? std::vector<int>{1, 8, 64, 128, 8192} : token_counts) {
    const int pairs = tokens * kTopK;
    const Tensor x = device_act(random_values(rng, size_t(tokens) * kHidden, 1.0f), tokens, kHidden);
    const uint16_t* xp = x.data_as<const uint16_t>();
    const int per_expert = (pairs + kExperts - 1) / kExperts;
    const int item_rows = cuda::detail::linear_item_rows(host_table[0], kHidden, 0, per_expert, true);
    const int max_items = (pairs + item_rows - 1) / item_rows + std::min(kExperts, pairs);
    s.logits.reserve(sizeof(float) * tokens * kExperts, "logits");
    s.choice_expert.reserve(sizeof(int32_t) * pairs, "choices");
    s.choice_weight.reserve(sizeof(float) * pairs, "choices");
    s.choice_row.reserve(sizeof(int32_t) * pairs, "choices");
    s.row_token.reserve(sizeof(int32_t) * pairs, "permutation");
    s.counts.reserve(sizeof(int32_t) * (2 * kExperts + 2), "counts");
    s.items.reserve(sizeof(cuda::detail::LinearItem) * max_items, "items");
    s.num_items.reserve(sizeof(int32_t), "items");
    s.act.reserve(size_t(pairs) * kInter * 2, "act");
    s.y.reserve(size_t(pairs) * kHidden * 2, "y");
    s.shared_act.reserve(size_t(tokens) * kInter * 2, "shared act");
    s.shared.reserve(size_t(tokens) * kHidden * 2, "shared");
    s.out.reserve(size_t(tokens) * kHidden * 2, "out");
    s.table.reserve(sizeof(WeightView) * host_table.size(), "table");
    check_cuda(cudaMemcpy(s.table.as(), host_table.data(), sizeof(WeightView) * host_table.size(),
                          cudaMemcpyHostToDevice),
               "table");
    const WeightView* table = s.table.as<const WeightView>();

    cuda::detail::LinearArgs sg;
    sg.x = xp;
    sg.x_stride = kHidden;
    sg.rows = tokens;
    sg.n = kInter;
    sg.k = kHidden;
    sg.w[0] = view_of(mlp.gate);
    sg.w[1] = view_of(mlp.up);
    sg.item_rows = cuda::detail::linear_item_rows(sg.w[0], kHidden, 2 * kInter, tokens);
    sg.out = s.shared_act.as<uint16_t>();
    sg.out_stride = kInter;
    sg.epilogue = cuda::detail::Epilogue::kSwiglu;
    cuda::detail::LinearArgs sd;
    sd.x = s.shared_act.as<const uint16_t>();
    sd.x_stride = kInter;
    sd.rows = tokens;
    sd.n = kHidden;
    sd.k = kInter;
    sd.w[0] = view_of(mlp.down);
    sd.item_rows = cuda::detail::linear_item_rows(sd.w[0], kInter, kHidden, tokens);
    sd.out = s.shared.as<uint16_t>();
    sd.out_stride = kHidden;

    cuda::detail::MoeRouteArgs r;
    r.x = xp;
    r.num_tokens = tokens;
    r.hidden = kHidden;
    r.router = mlp.router.data_as<const float>();
    r.num_experts = kExperts;
    r.top_k = kTopK;
    r.held_experts = kExperts;
    r.logits = s.logits.as<float>();
    r.choice_expert = s.choice_expert.as<int32_t>();
    r.choice_weight = s.choice_weight.as<float>();
    r.choice_row = s.choice_row.as<int32_t>();
    r.row_token = s.row_token.as<int32_t>();
    r.expert_count = s.counts.as<int32_t>();
    r.items = s.items.as<cuda::detail::LinearItem>();
    r.num_items = s.num_items.as<int32_t>();
    r.item_rows = item_rows;
    r.max_items = max_items;

    cuda::detail::LinearArgs gu;
    gu.x = xp;
    gu.x_stride = kHidden;
    gu.x_rows = r.row_token;
    gu.rows = pairs;
    gu.n = kInter;
    gu.k = kHidden;
    gu.w[0] = host_table[0];
    gu.w[1] = host_table[kExperts];
    gu.table[0] = table;
    gu.table[1] = table + kExperts;
    gu.items = r.items;
    gu.num_items = r.num_items;
    gu.max_items = max_items;
    gu.item_rows = item_rows;
    gu.out = s.act.as<uint16_t>();
    gu.out_stride = kInter;
    gu.epilogue = cuda::detail::Epilogue::kSwiglu;
    gu.table_streamed_ok = true;
    for (const WeightView& v : host_table) gu.table_streamed_ok = gu.table_streamed_ok && cuda::detail::streamed_weight_ok(v);
    cuda::detail::LinearArgs dn = gu;
    dn.x = s.act.as<const uint16_t>();
    dn.x_stride = kInter;
    dn.x_rows = nullptr;
    dn.n = kHidden;
    dn.k = kInter;
    dn.w[0] = host_table[2 * kExperts];
    dn.w[1] = WeightView();
    dn.table[0] = table + 2 * kExperts;
    dn.table[1] = nullptr;
    dn.out = s.y.as<uint16_t>();
    dn.out_stride = kHidden;
    dn.epilogue = cuda::detail::Epilogue::kStore;

    auto run_once = [&](bool timed) {
      auto mark = [&](int i) {
        if (timed) check_cuda(cudaEventRecord(ev[i], stream), "bench event");
      };
      mark(0);
      check_cuda(cuda::detail::launch_linear(sg, stream), "shared gate/up");
      mark(1);
      check_cuda(cuda::detail::launch_linear(sd, stream), "shared down");
      mark(2);
      check_cuda(cuda::detail::launch_moe_route(r, stream), "route");
      mark(3);
      check_cuda(cuda::detail::launch_moe_gate_up(gu, r, s.y.as<uint16_t>(), stream), "experts gate/up");
      mark(4);
      check_cuda(cuda::detail::launch_linear(dn, stream), "experts down");
      mark(5);
      check_cuda(cuda::detail::launch_moe_combine(s.y.as<const uint16_t>(), r.choice_row, r.choice_weight, tokens,
                                                  kTopK, kHidden, params.routed_scaling_factor,
                                                  s.shared.as<const uint16_t>(), s.out.as<uint16_t>(), stream),
                 "combine");
      mark(6);
    };
    run_once(false);
    check_cuda(cudaStreamSynchronize(stream), "bench warmup");
    std::vector<int32_t> counts(kExperts);
    check_cuda(cudaMemcpy(counts.data(), s.counts.as(), sizeof(int32_t) * kExperts, cudaMemcpyDeviceToHost),
               "expert counts");
    int distinct = 0;
    for (int32_t c : counts) distinct += c > 0;

    constexpr int kIters = 20;
    double step_us[kSteps - 1] = {};
    for (int it = 0; it < kIters; ++it) {
      run_once(true);
      check_cuda(cudaStreamSynchronize(stream), "bench");
      for (int i = 0; i + 1 < kSteps; ++i) {
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "bench event time");
        step_us[i] += 1e3 * ms / kIters;
      }
    }
    const double act = 2.0 * tokens * kHidden;  // one bf16 [tokens, hidden]
    const double step_bytes[kSteps - 1] = {
        shared_gate_up_bytes + act + 2.0 * tokens * kInter,
        shared_down_bytes + 2.0 * tokens * kInter + act,
        router_bytes + act,
        distinct * expert_gate_up_bytes + kTopK * act + 2.0 * pairs * kInter,
        distinct * expert_down_bytes + 2.0 * pairs * kInter + kTopK * act,
        kTopK * act + 3 * act};
    const double step_flops[kSteps - 1] = {4.0 * tokens * kHidden * kInter, 2.0 * tokens * kInter * kHidden,
                                           2.0 * tokens * kHidden * kExperts, 4.0 * pairs * kHidden * kInter,
                                           2.0 * pairs * kInter * kHidden, 0.0};
    double total_us = 0, total_bytes = 0;
    for (int i = 0; i + 1 < kSteps; ++i) {
      total_us += step_us[i];
      total_bytes += step_bytes[i];
      std::printf("%6d %-24s %9.1f %9.2f %9.0f %9.2f %9.1f\n", tokens, step_names[i], step_us[i],
                  step_bytes[i] / 1e6, step_bytes[i] / step_us[i] / 1e3, step_us[i] / (step_bytes[i] / copy_bytes_per_us),
                  step_flops[i] / step_us[i] / 1e6);
    }
    std::printf("%6d %-24s %9.1f %9.2f %9.0f %9.2f  (%d distinct experts, %d-row items)\n", tokens, "sum of kernels",
                total_us, total_bytes / 1e6, total_bytes / total_us / 1e3, total_us / (total_bytes / copy_bytes_per_us),
                distinct, item_rows);
    // One of the steps again on another kernel: an untimed launch first (with lazy module
    // loading the first launch of a kernel loads it), then kIters timed with events.
    auto time_alternative = [&](const cuda::detail::LinearArgs& l, int step, const char* label) {
      check_cuda(cuda::detail::launch_linear(l, stream), label);
      check_cuda(cudaEventRecord(ev[0], stream), "bench event");
      for (int it = 0; it < kIters; ++it) check_cuda(cuda::detail::launch_linear(l, stream), label);
      check_cuda(cudaEventRecord(ev[1], stream), "bench event");
      check_cuda(cudaEventSynchronize(ev[1]), label);
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, ev[0], ev[1]), "bench event time");
      const double us = 1e3 * ms / kIters;
      std::printf("%6d %-24s %9.1f %9.2f %9.0f %9.2f %9.1f\n", tokens, label, us, step_bytes[step] / 1e6,
                  step_bytes[step] / us / 1e3, us / (step_bytes[step] / copy_bytes_per_us), step_flops[step] / us / 1e6);
    };
    // The routed experts on the skinny kernel (the streamed one off), for comparison.
    if (gu.table_streamed_ok && item_rows == 16) {
      for (int step : {3, 4}) {
        cuda::detail::LinearArgs l = step == 3 ? gu : dn;
        l.table_streamed_ok = false;
        time_alternative(l, step, step == 3 ? "  gate/up, skinny kernel" : "  down, skinny kernel");
      }
    }
    // The shared expert (dense, mxfp8; 6144 weight rows) at 33-64 rows takes the streamed kernel's
    // wide form (64-row items), at 65-256 the wgmma kernel (linear_item_rows): the other kernel
    // beside it, for the crossover of the dense layers of decode batches 64-256. The alternative
    // runs alone, back to back, with its 41 MB of weights left in L2 (H100: 50 MB), where the
    // sequence above reads them cold: compare an alternative with the same line of another build,
    // not with the line above it.
    if (tokens > 32 && tokens <= 256) {
      for (int step : {0, 1}) {
        cuda::detail::LinearArgs l = step == 0 ? sg : sd;
        const bool wgmma = l.item_rows == cuda::detail::kWgmmaItemRows;
        l.item_rows = wgmma ? 64 : cuda::detail::kWgmmaItemRows;
        time_alternative(l, step, step == 0 ? (wgmma ? "  shared g/u, streamed" : "  shared g/u, wgmma")
                                            : (wgmma ? "  shared down, streamed" : "  shared down, wgmma"));
      }
    }

    // The backend op (its own stream), host-timed over back-to-back calls.
    Tensor out = backend->alloc({tokens, kHidden}, DType::kBF16);
    backend->moe(x, mlp, params, out);
    check_cuda(cudaDeviceSynchronize(), "moe warmup");
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < kIters; ++it) backend->moe(x, mlp, params, out);
    check_cuda(cudaDeviceSynchronize(), "moe");
    const double op_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kIters;
    std::printf("%6d %-24s %9.1f %9.2f %9.0f %9.2f\n", tokens, "backend moe op (host)", op_us, total_bytes / 1e6,
                total_bytes / op_us / 1e3, op_us / (total_bytes / copy_bytes_per_us));
    // The same op timed with events on the backend's stream (what a step pays: the shared expert
    // runs on a forked stream beside route + routed experts, joined before the combine).
    const cudaStream_t op_stream = static_cast<cudaStream_t>(cuda_backend_stream(*backend));
    check_cuda(cudaEventRecord(ev[0], op_stream), "bench event");
    for (int it = 0; it < kIters; ++it) backend->moe(x, mlp, params, out);
    check_cuda(cudaEventRecord(ev[1], op_stream), "bench event");
    check_cuda(cudaEventSynchronize(ev[1]), "moe");
    float op_ms = 0;
    check_cuda(cudaEventElapsedTime(&op_ms, ev[0], ev[1]), "bench event time");
    const double event_us = 1e3 * op_ms / kIters;
    std::printf("%6d %-24s %9.1f %9.2f %9.0f %9.2f\n", tokens, "backend moe op (events)", event_us,
                total_bytes / 1e6, total_bytes / event_us / 1e3, event_us / (total_bytes / copy_bytes_per_us));
  }
  for (cudaEvent_t& e : ev) check_cuda(cudaEventDestroy(e), "bench event");
  check_cuda(cudaStreamDestroy(stream), "bench stream");
}

}  // namespace m3::test
