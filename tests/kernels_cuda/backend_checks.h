// The CUDA backend's GPU checks (run by scripts/gpu-check-model.sh; not CTest tests: CI has no
// GPU): per-op checks against the CPU reference, and whole-model checks on the committed
// checkpoints. Each check adds one line per case to a Report.
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

// only: run the groups whose name contains it ("linear", "moe", "m3 attention kv nvfp4", ...).
void run_ops_checks(Report& report, bool quick, uint64_t seed, const std::string& only = "");
// Checkpoint directories relative to the repository root.
void run_model_checks(Report& report, const std::vector<std::string>& model_dirs, bool quick);
// Decode step times of a `layers`-layer M3.1 (dummy weights, every layer sparse + MoE) against
// the per-layer byte floor; config_path: an M3.1 config.json.
// only_case: "CONTEXTxBATCH" runs that shape alone (empty: the whole table).
void run_latency(const std::string& config_path, int layers, const std::string& only_case = "");

}  // namespace m3::test
