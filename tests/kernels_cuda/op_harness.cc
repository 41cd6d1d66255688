// The op harness's driver: backends per geometry, the comparison of each case's checks, and the
// perf mode (CUDA events on the backend's stream).
#include "tests/kernels_cuda/op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3::test {

using cuda::check_cuda;

// The FLOP floor a kernel is measured against in perf mode: the dense bf16 tensor-core peak measured
// on an H200 (an H100 SXM's is the same die at the same clock). The byte floor is this GPU's copy
// rate, measured when perf mode starts.
constexpr double kBf16FlopsPerSecond = 760e12;

Output ids_output(const std::vector<int32_t>& ids) {
  std::vector<uint8_t> bytes(ids.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), ids.data(), bytes.size());
  return Output(std::move(bytes));
}

std::vector<int32_t> output_ids(const Output& output) {
  std::vector<int32_t> ids(output.bytes.size() / sizeof(int32_t));
  std::memcpy(ids.data(), output.bytes.data(), ids.size() * sizeof(int32_t));
  return ids;
}

namespace {

double count_differing(const Output& a, const Output& b) {
  M3_CHECK(a.values.size() == b.values.size() && a.bytes.size() == b.bytes.size(),
           "outputs of different sizes ({} / {} values, {} / {} bytes)", a.values.size(), b.values.size(),
           a.bytes.size(), b.bytes.size());
  double n = 0;
  for (size_t i = 0; i < a.bytes.size(); ++i) n += a.bytes[i] != b.bytes[i];
  // Bitwise: -0 against 0 and NaN against NaN of another payload count as differing too.
  for (size_t i = 0; i < a.values.size(); ++i)
    n += std::memcmp(&a.values[i], &b.values[i], sizeof(float)) != 0;
  return n;
}

// One backend per geometry and side, configured once and shared by the cases of that geometry.
class Backends {
 public:
  explicit Backends(bool cpu_only) : cpu_only_(cpu_only) {}
  Backend& reference(const Geometry& g) { return get(refs_, g, true); }
  Backend& subject(const Geometry& g) { return get(subjects_, g, cpu_only_); }

 private:
  using Map = std::map<std::string, std::unique_ptr<Backend>>;
  static std::string key(const Geometry& g) {
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {}", g.name, g.hidden, g.heads, g.kv_heads, g.head_dim,
                       g.index_heads, g.index_dim, g.block_size, g.topk, g.local_blocks, g.init_blocks, g.rotary_dim,
                       g.batch_invariant);
  }
  Backend& get(Map& map, const Geometry& g, bool cpu) {
    std::unique_ptr<Backend>& b = map[key(g)];
    if (!b) {
      // Eager launches: a CUDA graph would record the first bind's tensors.
      b = cpu ? make_cpu_backend() : make_cuda_backend({.cuda_graphs = false, .batch_invariant = g.batch_invariant});
      configure(*b, g);
    }
    return *b;
  }
  bool cpu_only_;
  Map refs_, subjects_;
};

// FNV-1a of the case name: each case's inputs depend on the seed and its name only.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Outputs run_on(Backend& backend, const OpCase& c) {
  BoundCase bound = c.bind(backend);
  if (backend.device() == Device::kCuda) sync_device();  // uploads by cudaMemcpy before the op
  bound.launch();
  return bound.read();
}

// After a case threw on the GPU: true when the CUDA context is lost (an illegal address and the
// like stick), so that every later case would fail the same way.
bool cuda_context_lost() {
  if (cudaDeviceSynchronize() == cudaSuccess) return false;
  cudaGetLastError();
  return cudaDeviceSynchronize() != cudaSuccess;
}

void print_line(bool pass, const std::string& name, double error, double tolerance) {
  std::printf("%-4s %-84s err %.3e  tol %.1e\n", pass ? "ok" : "FAIL", name.c_str(), error, tolerance);
  std::fflush(stdout);
}

// The harness's control (--cpu-only, where got equals want): each output in turn is spoiled
// (every value moved by 4 (1 + |v|), every byte inverted); some check must then fail, else that
// output is measured by nothing. Returns the number of such outputs.
int unmeasured_outputs(const std::vector<Check>& checks, const Outputs& got, const Outputs& want) {
  int blind = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    Outputs spoiled = got;
    for (float& v : spoiled[i].values) v += 4.0f * (1.0f + std::fabs(v));
    for (uint8_t& b : spoiled[i].bytes) b = uint8_t(~b);
    bool seen = false;
    for (const Check& check : checks) seen = seen || !(check.error(spoiled, want) <= check.tolerance);
    blind += !seen;
  }
  return blind;
}

// Times bound.launch() on the backend's stream: a warm-up, then enough launches for ~20 ms.
double time_launch_us(Backend& backend, const BoundCase& bound) {
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_backend_stream(backend));
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "perf event");
  check_cuda(cudaEventCreate(&stop), "perf event");
  auto timed = [&](int iters) {
    check_cuda(cudaEventRecord(start, stream), "perf event");
    for (int i = 0; i < iters; ++i) bound.launch();
    check_cuda(cudaEventRecord(stop, stream), "perf event");
    check_cuda(cudaEventSynchronize(stop), "perf event");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "perf event");
    return 1e3 * double(ms) / iters;
  };
  bound.launch();
  const double first = timed(1);
  const int iters = std::clamp(int(2e4 / std::max(first, 1.0)), 3, 200);
  const double us = timed(iters);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return us;
}

}  // namespace

Check relative_error(std::string what, size_t output, double tolerance) {
  return {std::move(what), tolerance, [output](const Outputs& got, const Outputs& want) {
            return compare(got.at(output).values, want.at(output).values).rel();
          }};
}

Check bytes_differing(std::string what, size_t output, double tolerance) {
  return {std::move(what), tolerance, [output](const Outputs& got, const Outputs& want) {
            return count_differing(got.at(output), want.at(output));
          }};
}

Check self_differing(std::string what, size_t a, size_t b, double tolerance) {
  return {std::move(what), tolerance,
          [a, b](const Outputs& got, const Outputs&) { return count_differing(got.at(a), got.at(b)); }};
}

int run_harness(const CaseList& cases, const HarnessOptions& opt) {
  Backends backends(opt.cpu_only);
  int failures = 0, checks = 0, ran = 0;
  bool lost = false;
  double copy_bytes_per_second = 0;
  if (opt.perf) {
    copy_bytes_per_second = make_cuda_backend()->measure_copy_rate(int64_t{1} << 28, 10);
    std::printf("%% copy: of this GPU's copy rate, %.2f TB/s (a device-to-device copy)\n",
                copy_bytes_per_second / 1e12);
    std::printf("%-70s %10s %9s %7s %9s %7s\n", "case (CUDA backend)", "us", "GB/s", "% copy", "TFLOP/s", "% bf16");
  }
  for (const std::unique_ptr<OpCase>& c : cases) {
    const std::string name = c->name();
    if (!opt.filter.empty() && name.find(opt.filter) == std::string::npos) continue;
    if (opt.list) {
      std::printf("%s\n", name.c_str());
      continue;
    }
    if (lost) {  // not run: the context is gone
      ++failures;
      print_line(false, name + " (not run: the CUDA context is lost)", INFINITY, 0.0);
      continue;
    }
    ++ran;
    size_t num_checks = 1, measured = 0;  // until the case is built: one check, that fails
    try {
      std::mt19937_64 rng(opt.seed ^ name_hash(name));
      c->build(rng);
      // After build(): a check may size itself by the inputs.
      const std::vector<Check> case_checks = c->checks();
      num_checks = std::max<size_t>(1, case_checks.size());
      if (opt.perf) {
        Backend& gpu = backends.subject(c->geometry());
        BoundCase bound = c->bind(gpu);
        sync_device();
        const double us = time_launch_us(gpu, bound);
        const double gbs = c->bytes() / us / 1e3, tflops = c->flops() / us / 1e6;
        std::printf("%-70s %10.2f %9.1f %6.1f%% %9.2f %6.1f%%\n", name.c_str(), us, gbs,
                    100.0 * gbs * 1e9 / copy_bytes_per_second, tflops, 100.0 * tflops * 1e12 / kBf16FlopsPerSecond);
        std::fflush(stdout);
        continue;
      }
      const Outputs want = run_on(backends.reference(c->geometry()), *c);
      const Outputs got = run_on(backends.subject(c->geometry()), *c);
      // A check over nothing passes whatever the op did.
      for (const Outputs* side : {&want, &got})
        for (const Output& o : *side)
          M3_CHECK(!o.values.empty() || !o.bytes.empty(), "the case read back an empty output");
      for (const Check& check : case_checks) {
        const double error = check.error(got, want);
        const bool pass = error <= check.tolerance;  // NaN fails
        failures += !pass;
        ++checks, ++measured;
        print_line(pass, check.what.empty() ? name : name + " " + check.what, error, check.tolerance);
      }
      if (opt.cpu_only) {
        const int blind = unmeasured_outputs(case_checks, got, want);
        failures += blind > 0;
        if (blind) print_line(false, fmt::format("{}: {} output(s) no check sees", name, blind), blind, 0.0);
      }
    } catch (const std::exception& e) {
      // A case that throws (a failed launch, a contract check) fails all its checks; the next one runs.
      failures += opt.perf ? 1 : int(num_checks - measured);
      checks += opt.perf ? 0 : int(num_checks - measured);
      print_line(false, name + " ERROR: " + e.what(), INFINITY, 0.0);
      if (!opt.cpu_only && (lost = cuda_context_lost()))
        std::printf("     the CUDA context is lost: the remaining cases fail without running\n");
    }
  }
  if (!opt.list)
    std::printf("backend_ops%s: %d checks in %d cases, %d failed (seed %llu)\n",
                opt.perf ? " --perf" : opt.cpu_only ? " --cpu-only" : "", checks, ran, failures,
                static_cast<unsigned long long>(opt.seed));
  return failures;
}

}  // namespace m3::test
