// backend_check: the CUDA backend's whole-model GPU checks and its benchmarks (the per-op checks
// are backend_ops: op_harness.h).
//
//   backend_check model [--quick] [DIR...]        whole models on the committed checkpoints
//   backend_check graphs [DIR...]                 decode by CUDA graph replay vs eager, bitwise
//   backend_check bench [--only linear|split|attention|moe] [--tokens N,...]   M3.1 shapes:
//                                                 linear layers, the wgmma split-K sweep, fused
//                                                 attention input, MoE kernels (--tokens: those
//                                                 token counts only): time, GB/s
//   backend_check latency [--layers N] [--case CONTEXTxBATCH] [CONFIG]
//                                                 decode steps of an N-layer M3.1 (dummy weights)
// Exit status 1 when a case fails.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include "core/error.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "ops/kv_layout.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/backend_testing.h"
#include "tests/kernels_cuda/op_case_inputs.h"

namespace m3::test {

void Report::add(const std::string& name, double error, double tolerance) {
  const bool pass = error <= tolerance;  // NaN fails
  ++cases_;
  failures_ += !pass;
  std::printf("%-4s %-78s err %.3e  tol %.1e\n", pass ? "ok" : "FAIL", name.c_str(), error, tolerance);
  std::fflush(stdout);
}

void Report::note(const std::string& line) {
  std::printf("     %s\n", line.c_str());
  std::fflush(stdout);
}

namespace {

// A device LinearWeight of random bytes (timing only: values are irrelevant).
LinearWeight random_device_linear(std::mt19937_64& rng, int64_t out, int64_t in, WeightFormat format) {
  LinearWeight w;
  w.name = "bench";
  w.out_features = out;
  w.in_features = in;
  w.format = format;
  auto fill = [&](Shape shape, DType dtype, uint8_t lo, uint8_t hi) {
    Tensor h = Tensor::zeros(shape, dtype);
    std::uniform_int_distribution<int> d(lo, hi);
    uint8_t* p = h.data_as<uint8_t>();
    for (size_t i = 0; i < h.nbytes(); ++i) p[i] = static_cast<uint8_t>(d(rng));
    return to_device(h);
  };
  switch (format) {
    case WeightFormat::kDense:
      w.weight = fill({out, in}, DType::kBF16, 0x00, 0x3c);
      break;
    case WeightFormat::kMxfp8:
      w.weight = fill({out, in}, DType::kF8E4M3, 0x00, 0x7e);
      w.scale = fill({out, (in + 31) / 32}, DType::kU8, 120, 127);
      break;
    case WeightFormat::kNvfp4:
      w.weight = fill({out, in / 2}, DType::kU8, 0x00, 0xff);
      w.scale = fill({out, in / 16}, DType::kF8E4M3, 0x20, 0x50);
      w.global_divisor = 21504.0f;
      w.global_scale = 1.0f / 21504.0f;
      break;
    default:
      fail("bench: format not timed");
  }
  return w;
}

// Mean microseconds of f over `iters` runs after one warm-up run, the device synchronised around.
double time_us(const std::function<void()>& f, int iters, const char* what) {
  f();
  cuda::check_cuda(cudaDeviceSynchronize(), what);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  cuda::check_cuda(cudaDeviceSynchronize(), what);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// Decode- and prefill-shaped linear layers of M3.1 (hidden 6144): weight bytes read once per call.
// only: the sections whose name contains it (moe, split-k, linear, attention; empty: all). The
// split-K sweep's name leaves out "linear", so that `--only linear` is the linear layers alone.
// tokens: the MoE bench's token counts (empty: its own list).
void run_bench(const std::string& only, const std::vector<int>& tokens) {
  auto want = [&](const char* section) { return std::string(section).find(only) != std::string::npos; };
  if (want("moe")) run_moe_bench(tokens);
  if (want("split-k")) run_splitk_bench();
  if (!want("linear") && !want("attention")) return;
  std::mt19937_64 rng(7);
  auto backend = make_cuda_backend();
  configure(*backend, {"bench", 6144, 64, 4, 128, 4, 128, 128, 16, 1, 0, 64});
  struct Shape_ {
    const char* name;
    int64_t n, k;
    WeightFormat format;
  };
  const Shape_ shapes[] = {{"q_proj mxfp8", 8192, 6144, WeightFormat::kMxfp8},
                           {"o_proj mxfp8", 6144, 8192, WeightFormat::kMxfp8},
                           {"k_proj mxfp8", 512, 6144, WeightFormat::kMxfp8},
                           {"index_k mxfp8", 128, 6144, WeightFormat::kMxfp8},
                           {"expert w1 nvfp4", 3072, 6144, WeightFormat::kNvfp4},
                           {"expert w2 nvfp4", 6144, 3072, WeightFormat::kNvfp4},
                           {"lm_head/32 bf16", 200064 / 32, 6144, WeightFormat::kDense}};
  std::printf("%-18s %6s %10s %10s %9s\n", "linear", "rows", "us", "GB/s", "TFLOP/s");
  for (const Shape_& s : shapes) {
    if (!want("linear")) break;
    const LinearWeight w = random_device_linear(rng, s.n, s.k, s.format);
    for (int rows : {1, 8, 16, 32, 64, 96, 128, 192, 256, 2048, 8192}) {
      Tensor x = backend->alloc({rows, s.k}, DType::kBF16), y = backend->alloc({rows, s.n}, DType::kBF16);
      const double us = time_us([&] { backend->linear(x, w, y); }, rows >= 1024 ? 5 : 20, "linear bench");
      const double bytes = double(w.nbytes()) + 2.0 * rows * (s.k + s.n);
      std::printf("%-18s %6d %10.1f %10.1f %9.1f\n", s.name, rows, us, bytes / us / 1e3,
                  2.0 * rows * s.n * s.k / us / 1e6);
    }
  }

  // The attention projections of M3.1 (q, k, v, index q, index k; mxfp8): five linear() calls
  // against one linears() (one launch up to 256 rows).
  if (want("linear")) {
    const int64_t ns[] = {8192, 512, 512, 512, 128};
    std::vector<LinearWeight> ws;
    double wbytes = 0;
    for (int64_t n : ns) {
      ws.push_back(random_device_linear(rng, n, 6144, WeightFormat::kMxfp8));
      wbytes += double(ws.back().nbytes());
    }
    std::printf("\n%-24s %6s %12s %12s %10s\n", "q/k/v/index projections", "rows", "separate us", "linears us",
                "GB/s");
    for (int rows : {1, 8, 32, 64, 128}) {
      Tensor x = backend->alloc({rows, 6144}, DType::kBF16);
      std::vector<LinearOutput> outs;
      for (size_t i = 0; i < ws.size(); ++i) outs.push_back({&ws[i], backend->alloc({rows, ns[i]}, DType::kBF16)});
      const double separate = time_us(
          [&] {
            for (const LinearOutput& o : outs) backend->linear(x, *o.weight, o.out);
          },
          20, "projections bench");
      const double fused = time_us([&] { backend->linears(x, outs); }, 20, "projections bench");
      std::printf("%-24s %6d %12.1f %12.1f %10.1f\n", "mxfp8 9856x6144", rows, separate, fused,
                  (wbytes + 2.0 * rows * (6144 + 9856)) / fused / 1e3);
    }
  }

  // The fused attention input path against the separate ops (q/k/index-K norm + RoPE, insert),
  // M3 shape, nvfp4 caches: one prefill chunk of T tokens.
  if (!want("attention")) return;
  std::printf("\n%-28s %6s %10s %10s %8s\n", "attention input", "tokens", "fused us", "unfused us", "gain");
  const KvLayout layout = KvLayout::make(128, 4, 128, 128, KvDType::kNVFP4, KvDType::kNVFP4, {true});
  for (int tokens : {1, 64, 1024, 8192}) {
    const Step step = make_step({{tokens, tokens}}, 128, PageLayout::kDisjoint, 0, 1000, rng);
    backend->plan(step.batch);
    Tensor pool = backend->alloc({layout.block_bytes * step.num_blocks}, DType::kU8);
    const KvLayerView cache = layout.layer_view(pool.data_as<uint8_t>(), 0);
    Tensor q = backend->alloc({tokens, 64 * 128}, DType::kBF16), k = backend->alloc({tokens, 512}, DType::kBF16);
    Tensor v = backend->alloc({tokens, 512}, DType::kBF16), ik = backend->alloc({tokens, 128}, DType::kBF16);
    Tensor iq = backend->alloc({tokens, 4 * 128}, DType::kBF16);
    Tensor norm = backend->alloc({128}, DType::kF32);
    AttentionInputs in;
    in.q = q;
    in.num_q_heads = 64;
    in.k = k;
    in.v = v;
    in.q_norm = in.k_norm = in.index_k_norm = in.index_q_norm = norm;
    in.index_k = ik;
    in.index_q = iq;
    in.index_heads = 4;
    in.rope_dims = in.index_rope_dims = 64;
    const double fused = time_us([&] { backend->attention_input(cache, in); }, 10, "attention input bench");
    const double unfused = time_us(
        [&] {
          backend->head_norm_rope(q, 64, 128, norm, 1e-6f, 64);
          backend->head_norm_rope(k, 4, 128, norm, 1e-6f, 64);
          backend->head_norm_rope(ik, 1, 128, norm, 1e-6f, 64);
          backend->head_norm_rope(iq, 4, 128, norm, 1e-6f, 64);
          backend->kv_insert(cache, k, v, ik);
        },
        10, "attention input bench");
    std::printf("%-28s %6d %10.1f %10.1f %8.2f\n", "norm+rope+insert (nvfp4)", tokens, fused, unfused, unfused / fused);
  }
}

}  // namespace
}  // namespace m3::test

int main(int argc, char** argv) {
  using namespace m3::test;
  if (argc < 2) {
    std::fprintf(stderr, "usage: backend_check model|graphs|bench|latency [--quick] [--only SECTION] [--tokens N,...] [--layers N] [--case CxB] [DIR...]\n");
    return 2;
  }
  const std::string mode = argv[1];
  bool quick = false;
  int layers = 2;
  std::string only, only_case;
  std::vector<int> tokens;
  std::vector<std::string> dirs;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::stoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) only_case = argv[++i];
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p || t <= 0 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--tokens: expected a comma-separated list of positive counts, got '%s'\n", argv[i]);
          return 2;
        }
        tokens.push_back(int(t));
        p = *end == ',' ? end + 1 : end;
      }
    }
    else dirs.push_back(argv[i]);
  }
  try {
    Report rep;
    if (mode == "model") {
      if (dirs.empty())
        dirs = {"tests/model_golden/data/tiny-mixed",         "tests/model_golden/data/tiny-sparse-local2",
                "tests/model_golden/data/tiny-vl",            "tests/model_golden/data/release-mxfp8-nvfp4",
                "tests/model_golden/data/release-modelopt-nvfp4", "models/minimax-m3-tiny",
                "models/minimax-m3-small"};
      run_model_checks(rep, dirs, quick);
    } else if (mode == "graphs") {
      if (dirs.empty())
        dirs = {"tests/model_golden/data/tiny-mixed", "tests/model_golden/data/tiny-sparse-local2",
                "models/minimax-m3-tiny"};
      run_graph_checks(rep, "tests/model_loading/fixtures/m31_vl_config.json", dirs);
    } else if (mode == "bench") {
      run_bench(only, tokens);
      return 0;
    } else if (mode == "latency") {
      run_latency(dirs.empty() ? "tests/model_loading/fixtures/m31_vl_config.json" : dirs[0], layers, only_case);
      return 0;
    } else {
      std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    std::printf("%d of %d cases failed\n", rep.failures(), rep.cases());
    return rep.failures() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
