// The wgmma kernel's split-K at decode sizes: M3.1's dense MXFP8 projections at 65-256 rows, each
// launched with every split count of 1-8 and with the launcher's own choice (linear_wgmma.cu,
// wgmma_k_splits), timed with CUDA events, against the weight bytes at this GPU's copy rate. The
// rule's cost model (waves x (steps a split + a fixed cost)) is checked here: its choice should be
// within a few percent of the sweep's best.
#include <algorithm>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "ops/backend.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/bench_weights.h"

namespace m3::test {

using cuda::check_cuda;

void run_splitk_bench() {
  auto backend = make_cuda_backend();
  const double copy_bytes_per_us = backend->measure_copy_rate(int64_t{1} << 28, 10) / 1e6;
  std::printf("split-K sweep of the wgmma kernel (dense MXFP8, 256-row items); floors at %.2f TB/s\n",
              copy_bytes_per_us / 1e6);
  struct Shape {
    const char* name;
    int n, k;
  };
  // The fused attention projections (q, k, v, index q, index k: 9,856 rows, 77 tiles) as one weight
  // of as many tiles; o_proj; the dense layers' down projection; q_proj alone.
  const Shape shapes[] = {{"qkv fused 9856x6144", 9856, 6144},
                          {"o_proj 6144x8192", 6144, 8192},
                          {"q_proj 8192x6144", 8192, 6144},
                          {"dense down 6144x12288", 6144, 12288}};
  constexpr int kIters = 20, kMaxSplits = 8;
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "bench stream");
  cudaEvent_t ev[2];
  for (cudaEvent_t& e : ev) check_cuda(cudaEventCreate(&e), "bench event");
  std::printf("%-22s %5s %8s", "shape", "rows", "auto us");
  for (int s = 1; s <= kMaxSplits; ++s) std::printf(" %7s%d", "split", s);
  std::printf(" %9s\n", "auto/best");
  for (const Shape& sh : shapes) {
    const LinearWeight w = constant_weight(sh.n, sh.k, WeightFormat::kMxfp8);
    const double weight_bytes = double(w.weight.nbytes() + w.scale.nbytes());
    for (int rows : {96, 128, 192, 256}) {
      cuda::DeviceBuffer x, y;
      x.reserve(size_t(rows) * sh.k * 2, "bench x");
      y.reserve(size_t(rows) * sh.n * 2, "bench y");
      check_cuda(cudaMemset(x.as(), 0x3c, size_t(rows) * sh.k * 2), "bench fill");  // bf16 1.17
      cuda::detail::LinearArgs a;
      a.x = x.as<const uint16_t>();
      a.x_stride = sh.k;
      a.rows = rows;
      a.n = sh.n;
      a.k = sh.k;
      a.w[0] = view_of(w);
      a.item_rows = cuda::detail::kWgmmaItemRows;
      a.out = y.as<uint16_t>();
      a.out_stride = sh.n;
      auto time_us = [&](int splits) {
        a.k_splits = splits;
        check_cuda(cuda::detail::launch_linear(a, stream), "split-K bench");  // loads the module
        check_cuda(cudaEventRecord(ev[0], stream), "bench event");
        for (int it = 0; it < kIters; ++it) check_cuda(cuda::detail::launch_linear(a, stream), "split-K bench");
        check_cuda(cudaEventRecord(ev[1], stream), "bench event");
        check_cuda(cudaEventSynchronize(ev[1]), "split-K bench");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, ev[0], ev[1]), "bench event time");
        return 1e3 * ms / kIters;
      };
      const double auto_us = time_us(0);
      double best = auto_us;
      std::printf("%-22s %5d %8.1f", sh.name, rows, auto_us);
      for (int s = 1; s <= kMaxSplits; ++s) {
        const double us = time_us(s);
        best = std::min(best, us);
        std::printf(" %8.1f", us);
      }
      std::printf(" %9.2f  (best %.1f us: %.0f GB/s, x%.2f the weight floor)\n", auto_us / best, best,
                  weight_bytes / best / 1e3, best / (weight_bytes / copy_bytes_per_us));
    }
  }
  for (cudaEvent_t e : ev) check_cuda(cudaEventDestroy(e), "bench event");
  check_cuda(cudaStreamDestroy(stream), "bench stream");
}

}  // namespace m3::test
