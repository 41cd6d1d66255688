#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace m3::server {
namespace {

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so histograms line up across servers.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kTokenCountBuckets = {1,     2,      5,      10,     20,     50,    100,
                                                200,   500,    1000,   2000,   5000,   10000, 20000,
                                                50000, 100000, 200000, 500000, 1000000};

// vLLM's vllm:iteration_tokens_total buckets are the engine's (engine/engine_core.h), since the
// engine counts its steps into them.

// Prometheus prints floats the way Python's repr does for whole numbers ("12.0"); any
// round-trippable format parses, this one is what vLLM's output looks like.
std::string number(double value) {
  std::string s = fmt::format("{}", value);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  fmt::format_to(std::back_inserter(out), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

void sample(std::string& out, std::string_view name, std::string_view labels, double value) {
  fmt::format_to(std::back_inserter(out), "{}{{{}}} {}\n", name, labels, number(value));
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::lock_guard lock(mutex_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    std::string le = i < upper_bounds_.size() ? number(upper_bounds_[i]) : "+Inf";
    fmt::format_to(std::back_inserter(out), "{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le,
                   number(static_cast<double>(cumulative)));
  }
  fmt::format_to(std::back_inserter(out), "{}_sum{{{}}} {}\n", name, labels, number(sum_));
  fmt::format_to(std::back_inserter(out), "{}_count{{{}}} {}\n", name, labels,
                 number(static_cast<double>(count_)));
}

void LatencySummary::observe(double seconds) {
  std::lock_guard lock(mutex_);
  if (window_.size() < kWindow) {
    window_.push_back(seconds);
  } else {
    window_[next_] = seconds;
    next_ = (next_ + 1) % kWindow;
  }
  sum_ += seconds;
  ++count_;
}

double LatencySummary::quantile(double q) const {
  std::vector<double> sorted;
  {
    std::lock_guard lock(mutex_);
    sorted = window_;
  }
  if (sorted.empty()) return 0.0;
  const size_t k = std::min(sorted.size() - 1, static_cast<size_t>(q * double(sorted.size() - 1) + 0.5));
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
  return sorted[k];
}

uint64_t LatencySummary::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void LatencySummary::render(std::string& out, std::string_view name,
                            std::string_view labels) const {
  for (double q : {0.5, 0.9, 0.99}) {
    fmt::format_to(std::back_inserter(out), "{}{{{},quantile=\"{}\"}} {}\n", name, labels,
                   number(q), number(quantile(q)));
  }
  std::lock_guard lock(mutex_);
  fmt::format_to(std::back_inserter(out), "{}_sum{{{}}} {}\n", name, labels, number(sum_));
  fmt::format_to(std::back_inserter(out), "{}_count{{{}}} {}\n", name, labels,
                 number(static_cast<double>(count_)));
}

ServerMetrics::ServerMetrics(std::string model_name)
    : labels_(fmt::format("engine=\"0\",model_name=\"{}\"", escape_label_value(model_name))),
      ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kRequestLatencyBuckets),
      queue_(kRequestLatencyBuckets),
      prompt_tokens_(kTokenCountBuckets),
      generation_tokens_(kTokenCountBuckets),
      prefill_(kRequestLatencyBuckets),
      decode_(kRequestLatencyBuckets),
      inference_(kRequestLatencyBuckets),
      request_tpot_(kItlBuckets),
      tpot_legacy_(kItlBuckets) {}

void ServerMetrics::observe_request_phases(const RequestTimings& timings, int generation_tokens) {
  if (generation_tokens <= 0) return;
  prefill_.observe(timings.prefill_s);
  decode_.observe(timings.decode_s);
  inference_.observe(timings.inference_s);
  request_tpot_.observe(generation_tokens > 1 ? timings.decode_s / (generation_tokens - 1) : 0.0);
}

void ServerMetrics::observe_request_tokens(int prompt_tokens, int generation_tokens) {
  prompt_tokens_.observe(prompt_tokens);
  generation_tokens_.observe(generation_tokens);
}

void ServerMetrics::count_finished(FinishedReason reason) {
  ++finished_[static_cast<size_t>(reason)];
}

std::string ServerMetrics::render(const EngineStats& stats, const CacheConfigInfo* cache) const {
  std::string out;
  out.reserve(16384);
  const std::string& l = labels_;

  header(out, "vllm:num_requests_running", "gauge",
         "Number of requests in model execution batches.");
  sample(out, "vllm:num_requests_running", l, stats.num_running);
  header(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample(out, "vllm:num_requests_waiting", l, stats.num_waiting);
  header(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample(out, "vllm:kv_cache_usage_perc", l, stats.kv_usage);

  header(out, "vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.");
  sample(out, "vllm:prefix_cache_queries_total", l,
         static_cast<double>(stats.prefix_cache_queries_tokens));
  header(out, "vllm:prefix_cache_hits_total", "counter",
         "Prefix cache hits, in terms of number of cached tokens.");
  sample(out, "vllm:prefix_cache_hits_total", l,
         static_cast<double>(stats.prefix_cache_hits_tokens));
  // The host tier of the prefix cache (--kv-offloading-size; zeros without it): vLLM's counters of
  // its external (KV connector) tier, and m3serve's own for the copies.
  header(out, "vllm:external_prefix_cache_queries_total", "counter",
         "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
         "queried tokens.");
  sample(out, "vllm:external_prefix_cache_queries_total", l,
         static_cast<double>(stats.external_prefix_cache_queries_tokens));
  header(out, "vllm:external_prefix_cache_hits_total", "counter",
         "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
         "cached tokens.");
  sample(out, "vllm:external_prefix_cache_hits_total", l,
         static_cast<double>(stats.external_prefix_cache_hits_tokens));
  header(out, "m3:kv_offload_host_blocks", "gauge", "KV blocks the host tier of the prefix cache holds at most.");
  sample(out, "m3:kv_offload_host_blocks", l, static_cast<double>(stats.num_host_kv_blocks));
  header(out, "m3:kv_offload_host_blocks_stored", "gauge",
         "KV blocks stored in the host tier of the prefix cache.");
  sample(out, "m3:kv_offload_host_blocks_stored", l, static_cast<double>(stats.num_stored_host_kv_blocks));
  const std::string to_host = l + ",direction=\"to_host\"", to_device = l + ",direction=\"to_device\"";
  header(out, "m3:kv_offload_blocks_total", "counter",
         "KV blocks copied between the KV pool and its host tier (to_host: evicted or saved ahead of eviction, "
         "to_device: restored).");
  sample(out, "m3:kv_offload_blocks_total", to_host, static_cast<double>(stats.kv_offload_blocks_to_host));
  sample(out, "m3:kv_offload_blocks_total", to_device, static_cast<double>(stats.kv_offload_blocks_to_device));
  header(out, "m3:kv_offload_bytes_total", "counter",
         "Bytes copied between the KV pool and its host tier (every rank's share of the blocks).");
  sample(out, "m3:kv_offload_bytes_total", to_host, static_cast<double>(stats.kv_offload_bytes_to_host));
  sample(out, "m3:kv_offload_bytes_total", to_device, static_cast<double>(stats.kv_offload_bytes_to_device));
  header(out, "m3:kv_offload_seconds_total", "counter",
         "Seconds the copies between the KV pool and its host tier took (on the GPU: event-timed on the copy "
         "stream).");
  sample(out, "m3:kv_offload_seconds_total", to_host, stats.kv_offload_seconds_to_host);
  sample(out, "m3:kv_offload_seconds_total", to_device, stats.kv_offload_seconds_to_device);
  header(out, "m3:kv_offload_blocks_saved_ahead_total", "counter",
         "KV blocks copied to the host tier ahead of their eviction, overlapped with the steps (counted in "
         "m3:kv_offload_blocks_total too).");
  sample(out, "m3:kv_offload_blocks_saved_ahead_total", l, static_cast<double>(stats.kv_offload_blocks_saved_ahead));
  header(out, "m3:kv_offload_steps_waiting_total", "counter",
         "Engine steps that waited for copies to the host tier (a block evicted before it was saved ahead, or "
         "reused right after).");
  sample(out, "m3:kv_offload_steps_waiting_total", l, static_cast<double>(stats.kv_offload_steps_waiting));
  if (!stats.spec_accepted_per_pos.empty()) {  // speculative decoding on (vLLM shows these only then)
    header(out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
    sample(out, "vllm:spec_decode_num_drafts_total", l, static_cast<double>(stats.spec_num_drafts));
    header(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    sample(out, "vllm:spec_decode_num_draft_tokens_total", l, static_cast<double>(stats.spec_num_draft_tokens));
    header(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
    sample(out, "vllm:spec_decode_num_accepted_tokens_total", l, static_cast<double>(stats.spec_num_accepted_tokens));
    header(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (size_t i = 0; i < stats.spec_accepted_per_pos.size(); ++i) {
      sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", fmt::format("{},position=\"{}\"", l, i),
             static_cast<double>(stats.spec_accepted_per_pos[i]));
    }
    if (stats.spec_adaptive_verification) {
      header(out, "m3:spec_decode_num_unverified_draft_tokens_total", "counter",
             "Draft tokens adaptive verification left out of their step (their confidence was below the threshold).");
      sample(out, "m3:spec_decode_num_unverified_draft_tokens_total", l,
             static_cast<double>(stats.spec_num_unverified_draft_tokens));
      header(out, "m3:spec_decode_verify_threshold", "gauge",
             "Adaptive verification's threshold on a draft's running confidence (0 until a token's cost is known).");
      sample(out, "m3:spec_decode_verify_threshold", l, stats.spec_verify_threshold);
    }
  }
  header(out, "vllm:num_preemptions_total", "counter",
         "Cumulative number of preemption from the engine.");
  sample(out, "vllm:num_preemptions_total", l, static_cast<double>(stats.num_preemptions));
  header(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  sample(out, "vllm:prompt_tokens_total", l, static_cast<double>(stats.prompt_tokens_total));
  header(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  sample(out, "vllm:generation_tokens_total", l,
         static_cast<double>(stats.generation_tokens_total));

  header(out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  static constexpr const char* kReasons[] = {"stop", "length", "abort", "error"};
  for (size_t i = 0; i < finished_.size(); ++i) {
    sample(out, "vllm:request_success_total",
           fmt::format("{},finished_reason=\"{}\"", l, kReasons[i]),
           static_cast<double>(finished_[i].load()));
  }

  header(out, "vllm:time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.");
  ttft_.render(out, "vllm:time_to_first_token_seconds", l);
  header(out, "vllm:inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.");
  itl_.render(out, "vllm:inter_token_latency_seconds", l);
  header(out, "vllm:e2e_request_latency_seconds", "histogram",
         "Histogram of e2e request latency in seconds.");
  e2e_.render(out, "vllm:e2e_request_latency_seconds", l);
  header(out, "vllm:request_queue_time_seconds", "histogram",
         "Histogram of time spent in WAITING phase for request.");
  queue_.render(out, "vllm:request_queue_time_seconds", l);
  header(out, "vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.");
  prompt_tokens_.render(out, "vllm:request_prompt_tokens", l);
  header(out, "vllm:request_generation_tokens", "histogram",
         "Number of generation tokens processed.");
  generation_tokens_.render(out, "vllm:request_generation_tokens", l);
  header(out, "vllm:request_prefill_time_seconds", "histogram",
         "Histogram of time spent in PREFILL phase for request.");
  prefill_.render(out, "vllm:request_prefill_time_seconds", l);
  header(out, "vllm:request_decode_time_seconds", "histogram",
         "Histogram of time spent in DECODE phase for request.");
  decode_.render(out, "vllm:request_decode_time_seconds", l);
  header(out, "vllm:request_inference_time_seconds", "histogram",
         "Histogram of time spent in RUNNING phase for request.");
  inference_.render(out, "vllm:request_inference_time_seconds", l);
  header(out, "vllm:request_time_per_output_token_seconds", "histogram",
         "Histogram of time_per_output_token_seconds per request.");
  request_tpot_.render(out, "vllm:request_time_per_output_token_seconds", l);
  header(out, "vllm:time_per_output_token_seconds", "histogram",
         "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds instead.");
  tpot_legacy_.render(out, "vllm:time_per_output_token_seconds", l);

  header(out, "vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i < stats.iteration_tokens_counts.size(); ++i) {
    cumulative += stats.iteration_tokens_counts[i];
    const std::string le =
        i < kIterationTokenBuckets.size() ? number(static_cast<double>(kIterationTokenBuckets[i])) : "+Inf";
    fmt::format_to(std::back_inserter(out), "vllm:iteration_tokens_total_bucket{{{},le=\"{}\"}} {}\n", l, le,
                   number(static_cast<double>(cumulative)));
  }
  sample(out, "vllm:iteration_tokens_total_sum", l, static_cast<double>(stats.iteration_tokens_sum));
  sample(out, "vllm:iteration_tokens_total_count", l, static_cast<double>(cumulative));

  if (cache) {
    header(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
    sample(out, "vllm:cache_config_info",
           fmt::format("block_size=\"{}\",cache_dtype=\"{}\",enable_prefix_caching=\"{}\",engine=\"0\","
                       "gpu_memory_utilization=\"{}\",num_gpu_blocks=\"{}\"",
                       cache->block_size, escape_label_value(cache->cache_dtype),
                       cache->enable_prefix_caching ? "True" : "False", cache->gpu_memory_utilization,
                       cache->num_gpu_blocks),
           1);
  }

  header(out, "m3:token_to_socket_seconds", "summary",
         "Server overhead per streamed token: engine output to SSE bytes written to the socket "
         "(the last 65536 samples).");
  token_to_socket_.render(out, "m3:token_to_socket_seconds", l);
  return out;
}

}  // namespace m3::server
