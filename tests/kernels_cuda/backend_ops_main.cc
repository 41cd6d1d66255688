// backend_ops: every op of ops/backend.h, the CUDA backend against the CPU reference on the same
// random host inputs (op_harness.h).
//
//   backend_ops [--quick] [--seed N] [--filter SUBSTRING] [--perf] [--cpu-only] [--list]
//
// --quick: the CTest subset. --perf: times each case on the CUDA backend (CUDA events) against
// the H200 floors instead of comparing. --cpu-only: the CPU reference against itself, every case
// built, bound, run and measured (the harness's own check where no GPU is). Exit status: 0 when
// every check passes, 1 when one fails, 2 for bad arguments, 77 (CTest's SKIP_RETURN_CODE) when
// no CUDA device is usable: the CTest test then shows as skipped, not passed.
#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/cuda/backend/cuda_backend.h"
#include "tests/kernels_cuda/op_harness.h"

namespace {
constexpr int kSkipped = 77;
}

int main(int argc, char** argv) {
  using namespace m3::test;
  HarnessOptions opt;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--perf")) opt.perf = true;
    else if (!std::strcmp(argv[i], "--cpu-only")) opt.cpu_only = true;
    else if (!std::strcmp(argv[i], "--list")) opt.list = true;
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) opt.seed = std::stoull(argv[++i]);
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) opt.filter = argv[++i];
    else {
      std::fprintf(stderr, "usage: backend_ops [--quick] [--seed N] [--filter SUBSTRING] [--perf] [--cpu-only] [--list]\n");
      return 2;
    }
  }
  if (opt.perf && opt.cpu_only) {
    std::fprintf(stderr, "backend_ops: --perf times the CUDA backend; it does not go with --cpu-only\n");
    return 2;
  }
  if (!opt.cpu_only && !opt.list) {
    const m3::CudaDeviceInfo device = m3::cuda_device_info();
    if (!device.available) {
      std::printf("backend_ops: no usable CUDA device or driver here: skipped (the CUDA backend is checked on a GPU "
                  "machine, scripts/gpu-check-model.sh)\n");
      return kSkipped;
    }
    std::printf("backend_ops: %s (sm_%d, %d SMs)%s\n", device.name.c_str(), device.compute_capability,
                device.sm_count, quick ? ", quick" : "");
  }
  try {
    CaseList cases;
    add_elementwise_cases(cases, quick);
    add_linear_cases(cases, quick);
    add_attention_cases(cases, quick);
    add_msa_cases(cases, quick);
    add_dcp_cases(cases, quick);
    add_sampling_cases(cases, quick);
    add_kv_copy_cases(cases, quick);
    add_draft_cases(cases, quick);
    add_batch_invariance_cases(cases, quick);
    return run_harness(cases, opt) ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backend_ops: error: %s\n", e.what());
    return 1;
  }
}
