// Prometheus metrics with vLLM's names and labels (docs/reference.md D8), so dashboards and
// the AgentX harness read m3serve unchanged. Engine-side counters come from EngineStats; latency
// histograms and finished-request counts are observed here, as the client sees them (request
// arrival at the HTTP layer -> first token out, and between token outputs).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_core.h"

namespace m3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines; `labels` is e.g. `model_name="m"` (no braces).
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// The most recent samples of a latency (a fixed ring, so memory stays bounded), reported as a
// Prometheus summary with quantiles. For latencies too small and too tightly spread for the fixed
// buckets of a histogram (microseconds), where the quantiles themselves are what matters.
class LatencySummary {
 public:
  static constexpr size_t kWindow = 1u << 16;
  void observe(double seconds);
  // The q-quantile (0..1) of the samples in the window; 0 when there are none.
  double quantile(double q) const;
  uint64_t count() const;
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> window_;  // ring of the last kWindow samples
  size_t next_ = 0;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

enum class FinishedReason { kStop, kLength, kAbort, kError };

// The KV cache's configuration, published as vllm:cache_config_info (a gauge of 1 whose labels
// are the values, spelled as vLLM prints them).
struct CacheConfigInfo {
  int block_size = 0;
  std::string cache_dtype;           // --kv-cache-dtype as given ("auto", "fp8", "nvfp4", ...)
  bool enable_prefix_caching = false;
  double gpu_memory_utilization = 0.9;  // --gpu-memory-utilization (vLLM's default when not given)
  int64_t num_gpu_blocks = 0;        // the KV pool's blocks (on the CPU backend too)
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void observe_time_to_first_token(double seconds) { ttft_.observe(seconds); }
  // Also the deprecated vllm:time_per_output_token_seconds, which vLLM feeds with the same values.
  void observe_inter_token_latency(double seconds) {
    itl_.observe(seconds);
    tpot_legacy_.observe(seconds);
  }
  // A finished request's phases (engine/request.h RequestTimings) and its mean time per output
  // token after the first (vLLM's vllm:request_time_per_output_token_seconds: decode time over
  // generation tokens - 1, 0 for fewer than two tokens). Only for requests that produced a token.
  void observe_request_phases(const RequestTimings& timings, int generation_tokens);
  void observe_e2e_latency(double seconds) { e2e_.observe(seconds); }
  void observe_queue_time(double seconds) { queue_.observe(seconds); }
  void observe_request_tokens(int prompt_tokens, int generation_tokens);
  void count_finished(FinishedReason reason);
  // The server's own overhead on a streamed token: from the engine handing it over to its SSE
  // bytes being written to the client's socket.
  void observe_token_to_socket(double seconds) { token_to_socket_.observe(seconds); }
  const LatencySummary& token_to_socket() const { return token_to_socket_; }

  // Prometheus text exposition format 0.0.4; cache: the loaded model's (null while loading).
  std::string render(const EngineStats& stats, const CacheConfigInfo* cache = nullptr) const;

 private:
  std::string labels_;  // model_name="..." (escaped)
  Histogram ttft_, itl_, e2e_, queue_, prompt_tokens_, generation_tokens_;
  Histogram prefill_, decode_, inference_, request_tpot_, tpot_legacy_;
  std::array<std::atomic<uint64_t>, 4> finished_{};
  LatencySummary token_to_socket_;
};

// Prometheus label-value escaping: backslash, double quote and newline.
std::string escape_label_value(std::string_view value);

}  // namespace m3::server
