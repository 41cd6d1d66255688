// The backend op harness (backend_ops; llama.cpp's test-backend-ops in spirit): a table of op
// cases, each built once as host data from a seed, bound to the CPU reference and to the CUDA
// backend (the same host inputs uploaded through each backend), run, read back to the host and
// measured against each other per case. One line per check: name, error, tolerance, ok/FAIL.
//
// A case is an OpCase: a name (unique: it also seeds the case's inputs, so --filter does not
// change them), the Geometry its backends are configured for, build() (host inputs from an rng),
// bind() (the inputs on one backend: the op as a repeatable launch, and the read-back of its
// outputs), its checks (error measure and tolerance each) and, for --perf, the bytes and FLOPs the
// op cannot do without.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels_cuda/backend_testing.h"

namespace m3::test {

// One result of a case, read back to the host after the op ran.
struct Output {
  Output() = default;
  Output(std::vector<float> v) : values(std::move(v)) {}    // NOLINT: implicit, {read_act(...)}
  Output(std::vector<uint8_t> b) : bytes(std::move(b)) {}  // NOLINT: implicit, {read_bytes(...)}
  std::vector<float> values;   // activations as fp32 (Backend::copy_to_host_f32)
  std::vector<uint8_t> bytes;  // bytes as stored: KV pools, selections, sampled ids
};
using Outputs = std::vector<Output>;
// I32 results (selections, sampled ids) as an Output's bytes, and back.
Output ids_output(const std::vector<int32_t>& ids);
std::vector<int32_t> output_ids(const Output& output);

// One measured property of a case's outputs: error(got = CUDA's, want = the CPU reference's)
// passes when <= tolerance (NaN fails).
struct Check {
  std::string what;  // appended to the case's name; empty for a case's only check
  double tolerance = 0;
  std::function<double(const Outputs& got, const Outputs& want)> error;
};
// max |got - want| / max |want| over output i's values.
Check relative_error(std::string what, size_t output, double tolerance);
// The number of bytes of output i that differ.
Check bytes_differing(std::string what, size_t output, double tolerance);
// The backend against itself: how many values or bytes of got[a] and got[b] differ (a fused op
// against the separate ops it promises to equal, a second run against the first).
Check self_differing(std::string what, size_t a, size_t b, double tolerance = 0);

// A case's inputs on one backend. The tensors live in the closures.
struct BoundCase {
  std::function<void()> launch;   // the op alone (no uploads, no reads): --perf repeats it
  std::function<Outputs()> read;  // after launch: the outputs, on the host
};

class OpCase {
 public:
  virtual ~OpCase() = default;
  virtual std::string name() const = 0;
  virtual Geometry geometry() const = 0;
  // The host inputs; called once, before any bind().
  virtual void build(std::mt19937_64& rng) = 0;
  virtual BoundCase bind(Backend& backend) const = 0;
  virtual std::vector<Check> checks() const = 0;
  // For --perf: bytes the op must read and write at least, and its FLOPs (0: not counted).
  virtual double bytes() const { return 0; }
  virtual double flops() const { return 0; }
};
using CaseList = std::vector<std::unique_ptr<OpCase>>;

// The case tables, one per op group (cases_*.cc). quick: the subset CTest runs.
void add_elementwise_cases(CaseList& cases, bool quick);  // embed, gather, norms, adds, RoPE
void add_linear_cases(CaseList& cases, bool quick);       // linear, swiglu_mlp, moe
void add_attention_cases(CaseList& cases, bool quick);    // kv_insert .. paged_attention, 2 shapes
void add_msa_cases(CaseList& cases, bool quick);          // the MSA kernels' layouts and sizes
void add_dcp_cases(CaseList& cases, bool quick);          // indexer DCP: candidates and merge
void add_sampling_cases(CaseList& cases, bool quick);     // sample
void add_kv_copy_cases(CaseList& cases, bool quick);      // copy_kv_blocks (the prefix cache's host tier)
void add_draft_cases(CaseList& cases, bool quick);        // the DSpark drafter's attention and heads
// --batch-invariant: rows alone against the same rows in batches, bitwise (linears, MLP, MoE)
void add_batch_invariance_cases(CaseList& cases, bool quick);

struct HarnessOptions {
  std::string filter;         // run cases whose name contains it (empty: all)
  uint64_t seed = 1;
  bool perf = false;          // time the CUDA backend instead of comparing
  // The CPU reference against itself (no GPU: the harness's own check): every check must pass,
  // and every output must make some check fail once spoiled (unmeasured_outputs).
  bool cpu_only = false;
  bool list = false;          // print the case names only
};
// Runs the cases; returns the number of failed checks (perf, list: cases that threw).
int run_harness(const CaseList& cases, const HarnessOptions& options);

}  // namespace m3::test
