// The CUDA backend's whole-model GPU checks and benchmarks (backend_check, run by
// scripts/gpu-check-model.sh; the per-op checks are backend_ops, op_harness.h): whole models on
// the committed checkpoints, CUDA-graph replay. Each check adds one line per case to a Report.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::test {

class Report {
 public:
  // A case passes when error <= tolerance (NaN fails).
  void add(const std::string& name, double error, double tolerance);
  // Informational line (measurements, skipped cases).
  void note(const std::string& line);
  int failures() const { return failures_; }
  int cases() const { return cases_; }

 private:
  int failures_ = 0;
  int cases_ = 0;
};

// Checkpoint directories relative to the repository root.
void run_model_checks(Report& report, const std::vector<std::string>& model_dirs, bool quick);
// CUDA graphs: decode steps replayed from graphs against --enforce-eager, bitwise (logits and KV
// bytes), on an M3-shaped model built from the M3.1 config at m31_config_path and on the
// checkpoints in model_dirs.
void run_graph_checks(Report& report, const std::string& m31_config_path, const std::vector<std::string>& model_dirs);
// Decode step times of a `layers`-layer M3.1 (dummy weights, every layer sparse + MoE) against
// the per-layer byte floor; config_path: an M3.1 config.json.
// only_case: "CONTEXTxBATCH" runs that shape alone (empty: the whole table).
void run_latency(const std::string& config_path, int layers, const std::string& only_case = "");
// The MoE op at the M3.1 shape for 1/8/64/128/8192 tokens (or `tokens`): every kernel timed with
// CUDA events against the bytes it must read (backend_moe_bench.cc).
void run_moe_bench(const std::vector<int>& tokens = {});
// The wgmma kernel's split-K at decode sizes: every split count against the launcher's choice
// (backend_splitk_bench.cc).
void run_splitk_bench();

}  // namespace m3::test
