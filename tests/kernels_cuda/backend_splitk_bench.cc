// The wgmma kernel's split-K at decode sizes: M3.1's dense MXFP8 projections at 65-256 rows (and
// at 16-64 against the streamed kernel), each launched with every split count of 1-8 and with the
// launcher's own choice (linear_wgmma.cu, wgmma_k_splits), timed with CUDA events, against the
// weight bytes at this GPU's copy rate. The rule's cost model (waves x (steps a split + a fixed
// cost)) is checked here: its choice should be within a few percent of the sweep's best.
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

namespace {

constexpr int kIters = 20, kMaxSplits = 8;

// The stream and events every timing of the sweep uses.
struct Timer {
  Timer() {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "bench stream");
    for (cudaEvent_t& e : ev) check_cuda(cudaEventCreate(&e), "bench event");
  }
  ~Timer() {
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    cudaStreamDestroy(stream);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  cudaStream_t stream = nullptr;
  cudaEvent_t ev[2] = {};
};

// One dense MXFP8 problem (x all bf16 1.17).
class DenseProblem {
 public:
  DenseProblem(const LinearWeight& w, int n, int k, int rows, Timer& timer) : timer_(timer) {
    x_.reserve(size_t(rows) * k * 2, "bench x");
    y_.reserve(size_t(rows) * n * 2, "bench y");
    check_cuda(cudaMemset(x_.as(), 0x3c, size_t(rows) * k * 2), "bench fill");
    a_.x = x_.as<const uint16_t>();
    a_.x_stride = k;
    a_.rows = rows;
    a_.n = n;
    a_.k = k;
    a_.w[0] = view_of(w);
    a_.out = y_.as<uint16_t>();
    a_.out_stride = n;
  }

  // us a launch with `item_rows` rows an item and `splits` K splits (0: the launcher's choice), the
  // mean of kIters after one that loads the module.
  double time_us(int item_rows, int splits) {
    a_.item_rows = item_rows;
    a_.k_splits = splits;
    cudaStream_t s = timer_.stream;
    check_cuda(cuda::detail::launch_linear(a_, s), "split-K bench");
    check_cuda(cudaEventRecord(timer_.ev[0], s), "bench event");
    for (int it = 0; it < kIters; ++it) check_cuda(cuda::detail::launch_linear(a_, s), "split-K bench");
    check_cuda(cudaEventRecord(timer_.ev[1], s), "bench event");
    check_cuda(cudaEventSynchronize(timer_.ev[1]), "split-K bench");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, timer_.ev[0], timer_.ev[1]), "bench event time");
    return 1e3 * ms / kIters;
  }

 private:
  Timer& timer_;
  cuda::DeviceBuffer x_, y_;
  cuda::detail::LinearArgs a_;
};

// Prints every split count's time (the wgmma kernel, 256-row items); returns the least of them and `best`.
double print_splits(DenseProblem& p, double best) {
  for (int s = 1; s <= kMaxSplits; ++s) {
    const double us = p.time_us(cuda::detail::kWgmmaItemRows, s);
    best = std::min(best, us);
    std::printf(" %8.1f", us);
  }
  return best;
}

}  // namespace

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
  Timer timer;
  auto split_columns = [] {
    for (int s = 1; s <= kMaxSplits; ++s) std::printf(" %7s%d", "split", s);
    std::printf(" %9s\n", "auto/best");
  };
  std::printf("%-22s %5s %8s", "shape", "rows", "auto us");
  split_columns();
  for (const Shape& sh : shapes) {
    const LinearWeight w = constant_weight(sh.n, sh.k, WeightFormat::kMxfp8);
    const double weight_bytes = double(w.weight.nbytes() + w.scale.nbytes());
    const double floor_us = weight_bytes / copy_bytes_per_us;
    for (int rows : {96, 128, 192, 256}) {
      DenseProblem p(w, sh.n, sh.k, rows, timer);
      const double auto_us = p.time_us(cuda::detail::kWgmmaItemRows, 0);
      std::printf("%-22s %5d %8.1f", sh.name, rows, auto_us);
      const double best = print_splits(p, auto_us);
      std::printf(" %9.2f  (best %.1f us: %.0f GB/s, x%.2f the weight floor)\n", auto_us / best, best,
                  weight_bytes / best / 1e3, best / floor_us);
    }
  }
  // Dense layers of 16-64 rows: the launcher's choice (auto: linear_item_rows sends wide layers of
  // 33-64 rows to the wgmma kernel's 64-row size, two CTAs an SM, with its own split), the streamed
  // kernel (16-, 32- and 64-row items: what took every layer of up to 64 rows until session 48),
  // and the wgmma kernel's 64-row size with 1-8 splits.
  std::printf("\n16-64 rows: the launcher (auto), the streamed kernel, the wgmma kernel's 64-row size split 1-%d\n",
              kMaxSplits);
  std::printf("%-22s %5s %8s %9s", "shape", "rows", "auto us", "streamed");
  split_columns();
  for (const Shape& sh : shapes) {
    const LinearWeight w = constant_weight(sh.n, sh.k, WeightFormat::kMxfp8);
    const double floor_us = double(w.weight.nbytes() + w.scale.nbytes()) / copy_bytes_per_us;
    for (int rows : {16, 24, 32, 48, 64}) {
      DenseProblem p(w, sh.n, sh.k, rows, timer);
      const int production = cuda::detail::linear_item_rows(view_of(w), sh.k, sh.n, rows);
      const double auto_us = p.time_us(production, 0);
      // No weight rows: the item size the streamed and skinny kernels take.
      const double streamed = p.time_us(cuda::detail::linear_item_rows(view_of(w), sh.k, 0, rows), 0);
      std::printf("%-22s %5d %8.1f %9.1f", sh.name, rows, auto_us, streamed);
      const double best = print_splits(p, auto_us);
      std::printf(" %9.2f  (%s; best %.1f us: x%.2f the weight floor; streamed x%.2f)\n", auto_us / best,
                  production == cuda::detail::kWgmmaItemRows ? "wgmma" : "streamed", best, best / floor_us,
                  streamed / floor_us);
    }
  }
}

}  // namespace m3::test
