// m3serve bench latency: decode step time and prefill throughput of the model itself (no engine,
// no sampler), against the byte floor (decode) and the FLOP floor (prefill), as vLLM's
// `bench latency` but per shape. Numbers are also given per layer so that a run of the first N
// layers (--num-layers, the whole model may not fit one device) scales to the full depth.
//
// Decode case (batch B, context C): B requests of C - 1 cached tokens and one new token, each on
// its own pages; a step is the serving path's: forward, sampling on the backend (greedy, or
// --temperature / --top-k / --top-p, and --logprobs answered beside the draw) and the copy of the
// sampled ids (the step's one synchronisation). The KV pool is sized for the largest case that fits --kv-cache-memory and holds
// zeros (no prefill writes it): the bytes read and the work done are those of a real step; only
// the indexer's top-k choice among equal scores (ties go to the lower block) differs from real
// data, and its cost does not depend on which blocks win.
// Byte floor of a step = weights touched + KV read:
//   weights: every non-expert tensor of every layer (attention, indexer, norms, router, shared
//   expert, dense MLP) + per MoE layer E (1 - (1 - k/E)^B) distinct routed experts (uniform
//   routing) x bytes of one expert + B embedding rows + lm_head + final norm;
//   KV per request and layer: sparse layers index-K of C tokens + K and V of
//   min(C, topk_blocks x block_size) tokens per KV head; full layers K and V of C tokens,
//   at the bytes per token of ops/kv_layout.h.
// Prefill: one request of L tokens in chunks of --chunk-size, logits of the last token only.
// FLOP floor = sum over positions p < L of [2 x active linear params (every linear a token goes
//   through: attention, indexer, router, shared expert, k routed experts or the dense MLP)
//   + per full layer 4 Hq D (p + 1) + per sparse layer 2 Hi Di (p + 1)
//   + 4 Hq D min(p + 1, topk_blocks x block_size)] + 2 x lm_head params (one row).
#include <CLI/CLI.hpp>
#include <omp.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "app/bench_timing_backend.h"
#include "app/commands.h"
#include "app/kernel_timeline.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "model/dspark.h"
#include "model/minimax_m3.h"
#include "model/weights.h"
#include "ops/sampling.h"
#if M3SERVE_WITH_CUDA
#include "kernels/cuda/backend/cuda_backend.h"
#endif

namespace m3::app {
namespace {

using BenchClock = std::chrono::steady_clock;

struct BenchLatencyOptions {
  ModelOptions model;
  std::string batch_sizes = "1,8,32,64,128";
  std::string context_lens = "8192,131072";
  std::string prefill_lens = "8192,65536";
  int chunk_size = 8192;
  int warmup = 2;
  int iters = 5;
  double bandwidth = -1;  // bytes/s; < 0: the device's copy rate, measured
  double flops = -1;      // FLOP/s; < 0: 7.6e14 (bf16 dense) on cuda, none on cpu
  bool op_breakdown = true;
  bool json = false;
  std::string spec_tokens;  // k values: the floor of a speculative verification step (1 + k tokens a request)
  double spec_acceptance = 3.2;  // the acceptance length the verification step's tokens/s per user assumes
  std::string spec_drafter;      // a DSpark drafter's directory: its steps timed beside the verification's
  // The decode step's sampling (every request the same): greedy by default.
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  int logprobs = -1;  // top logprobs a token (-1: none)
  bool kernel_timeline = false;  // one more step (decode) / prompt (prefill) recorded kernel by kernel (CUPTI)
};

// What a step can touch, measured on the weights as stored (their formats do not change on a device).
struct WeightBytes {
  double always = 0;            // every tensor read whatever the batch (all but experts and embed)
  double expert = 0;            // one routed expert (mean over MoE layers)
  int moe_layers = 0;
  int num_experts = 0, experts_per_token = 0;
  double embed_row = 0;         // one embedding row
  double lm_head = 0;
  double active_params = 0;     // linear params one token goes through (lm_head excluded)
  double lm_head_params = 0;

  double touched(int batch) const {
    const double distinct =
        num_experts ? num_experts * (1.0 - std::pow(1.0 - double(experts_per_token) / num_experts, batch)) : 0.0;
    return always + moe_layers * distinct * expert + batch * embed_row + lm_head;
  }
};

double params(const LinearWeight& w) { return w.defined() ? double(w.out_features) * double(w.in_features) : 0.0; }
double bytes(const LinearWeight& w) { return w.defined() ? double(w.nbytes()) : 0.0; }
double bytes(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }

WeightBytes measure_weights(const ModelConfig& config, const ModelWeights& w) {
  WeightBytes b;
  b.num_experts = config.num_experts;
  b.experts_per_token = config.experts_per_token;
  b.embed_row = bytes(w.embed) / std::max<int64_t>(1, w.embed.dim(0));
  b.lm_head = bytes(w.lm_head);
  b.lm_head_params = params(w.lm_head);
  b.always = bytes(w.final_norm);
  double expert_bytes = 0;
  for (const LayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attn;
    b.always += bytes(l.input_norm) + bytes(l.post_attn_norm) + bytes(a.q_norm) + bytes(a.k_norm) +
                bytes(a.index_q_norm) + bytes(a.index_k_norm);
    for (const LinearWeight* lw : {&a.q, &a.k, &a.v, &a.o, &a.index_q, &a.index_k, &l.mlp.gate, &l.mlp.up,
                                   &l.mlp.down}) {
      b.always += bytes(*lw);
      b.active_params += params(*lw);
    }
    b.always += bytes(l.mlp.router) + bytes(l.mlp.router_bias);
    if (l.mlp.router.defined()) b.active_params += double(l.mlp.router.numel());
    if (l.mlp.experts.empty()) continue;
    ++b.moe_layers;
    double layer_expert_bytes = 0, one_expert_params = 0;
    for (const ExpertWeights& e : l.mlp.experts) {
      layer_expert_bytes += bytes(e.gate) + bytes(e.up) + bytes(e.down);
      one_expert_params = params(e.gate) + params(e.up) + params(e.down);
    }
    expert_bytes += layer_expert_bytes / double(l.mlp.experts.size());
    b.active_params += config.experts_per_token * one_expert_params;
  }
  b.expert = b.moe_layers ? expert_bytes / b.moe_layers : 0.0;
  return b;
}

// KV bytes one token occupies in one layer, split as the floor reads them.
struct KvTokenBytes {
  double kv_per_head = 0;  // K + V of one KV head
  double index = 0;        // index-K (sparse layers)
};

KvTokenBytes kv_token_bytes(const KvLayout& layout) {
  return {2.0 * (kv_data_bytes(layout.kv_dtype, layout.head_dim) + kv_scale_bytes(layout.kv_dtype, layout.head_dim)),
          double(kv_data_bytes(layout.index_dtype, layout.index_dim) +
                 kv_scale_bytes(layout.index_dtype, layout.index_dim))};
}

// KV bytes a step of `queries` tokens per request reads: the index keys once (one indexer pass
// scores every query of a request), and on sparse layers the selected blocks of each query: once
// when the queries share their selection (distinct_selection false: the floor), each query its own
// when they do not (up to the context).
double step_kv_bytes(const ModelConfig& c, const KvLayout& layout, int batch, int64_t context, int queries,
                     bool distinct_selection) {
  const KvTokenBytes t = kv_token_bytes(layout);
  const double one = std::min<double>(double(context), double(c.index_topk_blocks) * c.index_block_size);
  const double selected = distinct_selection ? std::min<double>(double(context), queries * one) : one;
  double per_request = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    if (layout.layer_has_index[l]) {
      per_request += context * t.index + selected * c.num_kv_heads * t.kv_per_head;
    } else {
      per_request += double(context) * c.num_kv_heads * t.kv_per_head;
    }
  }
  return batch * per_request;
}

double decode_kv_bytes(const ModelConfig& c, const KvLayout& layout, int batch, int64_t context) {
  return step_kv_bytes(c, layout, batch, context, 1, false);
}

double prefill_flops(const ModelConfig& c, const WeightBytes& w, int64_t len) {
  const double window = double(c.index_topk_blocks) * c.index_block_size;
  const int sparse = c.num_sparse_layers(), full = c.num_layers - sparse;
  double flops = 2.0 * w.lm_head_params;
  for (int64_t p = 0; p < len; ++p) {
    const double keys = double(p + 1);
    flops += 2.0 * w.active_params + full * 4.0 * c.num_heads * c.head_dim * keys +
             sparse * (2.0 * c.index_heads * c.index_head_dim * keys +
                       4.0 * c.num_heads * c.head_dim * std::min(keys, window));
  }
  return flops;
}

std::vector<int> parse_list(const std::string& text, const std::string& option) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int value = 0;
    try {
      value = std::stoi(item);
    } catch (const std::exception&) {
      fail("{}: '{}' is not a number (expected e.g. 1,8,32)", option, item);
    }
    M3_CHECK(value >= 1, "{}: values must be >= 1, got {}", option, value);
    out.push_back(value);
  }
  return out;
}

// One decode step: `batch` requests of `context` tokens (the last one new), disjoint pages. With
// drafts > 0, a speculative verification step: each request's last token and `drafts` more after
// it, a logits row for each.
StepBatch decode_batch(int batch, int context, int block_size, int vocab, int drafts = 0) {
  StepBatch b;
  const int len = context + drafts;
  const int pages = (len + block_size - 1) / block_size;
  b.pages_per_seq = pages;
  b.query_start.push_back(0);
  for (int s = 0; s < batch; ++s) {
    for (int pos = context - 1; pos < len; ++pos) {
      b.logits_rows.push_back(b.num_tokens());
      b.token_ids.push_back(static_cast<int32_t>((int64_t(s) * 7919 + 11 + pos) % vocab));
      b.positions.push_back(pos);
      b.token_seq.push_back(s);
      b.slot_mapping.push_back((s * pages + pos / block_size) * block_size + pos % block_size);
    }
    b.seq_lens.push_back(len);
    for (int p = 0; p < pages; ++p) b.page_table.push_back(s * pages + p);
    b.query_start.push_back(b.num_tokens());
  }
  return b;
}

// Greedy sampling of every logits row of `batch`, as the serving path samples them.
SampleBatch greedy_rows(const StepBatch& batch) {
  SampleBatch greedy;
  for (size_t i = 0; i < batch.logits_rows.size(); ++i) {
    SampleRow row;
    row.logits_row = static_cast<int32_t>(i);
    row.temperature = 0.0f;
    greedy.rows.push_back(row);
  }
  return greedy;
}

// The decode step's sampling: every row with the options' parameters (seeded by its row), and a
// logprob row on each draw when --logprobs asks for them.
SampleBatch decode_rows(const StepBatch& batch, const BenchLatencyOptions& o) {
  SampleBatch rows = greedy_rows(batch);
  for (size_t i = 0; i < rows.rows.size(); ++i) {
    SampleRow& row = rows.rows[i];
    row.temperature = o.temperature;
    row.top_k = o.top_k;
    row.top_p = o.top_p;
    row.seed = i;
    if (o.logprobs < 0) continue;
    LogprobRow q;
    q.logits_row = row.logits_row;
    q.top_k = o.logprobs;
    q.drawn_by[0] = static_cast<int32_t>(i);
    rows.logprobs.push_back(q);
  }
  return rows;
}

// Chunks of one prompt of `len` tokens on pages 0..; logits of the prompt's last token only.
std::vector<StepBatch> prefill_chunks(int len, int chunk, int block_size, int vocab) {
  const int pages = (len + block_size - 1) / block_size;
  std::vector<StepBatch> out;
  for (int start = 0; start < len; start += chunk) {
    const int end = std::min(len, start + chunk);
    StepBatch b;
    b.pages_per_seq = pages;
    b.query_start = {0, end - start};
    b.seq_lens = {end};
    for (int p = 0; p < pages; ++p) b.page_table.push_back(p);
    for (int pos = start; pos < end; ++pos) {
      b.token_ids.push_back(static_cast<int32_t>((int64_t(pos) * 7919 + 11) % vocab));
      b.positions.push_back(pos);
      b.token_seq.push_back(0);
      b.slot_mapping.push_back(pos);  // page p is block p
    }
    if (end == len) b.logits_rows.push_back(end - start - 1);
    out.push_back(std::move(b));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The model on a timing wrapper of the chosen backend, with the weights' byte summary.
struct BenchModel {
  LoadedModel loaded;
  TimingBackend* timing = nullptr;  // rank 0's wrapper (its ops are timed)
  MiniMaxM3* model = nullptr;       // rank 0's
  std::unique_ptr<ModelRunner> runner;  // every rank
  std::string device;
  WeightBytes weights;
  std::unique_ptr<DSparkDrafter> drafter;  // --spec-drafter, on rank 0's (timed) backend
};

struct DecodeCase {
  int batch = 0, context = 0;
  int64_t blocks = 0;
};

struct PrefillCase {
  int len = 0;
  int64_t blocks = 0;
};

// Loads through the one loader, on a timing wrapper of the device backend, with a KV pool for the
// largest case (within the device's budget: cases that do not fit are skipped).
BenchModel load_bench_model(const BenchLatencyOptions& o, const std::vector<DecodeCase>& decode,
                            const std::vector<PrefillCase>& prefill, int block_size) {
  int64_t largest = 1;
  int max_batch = 1;
  for (const DecodeCase& c : decode) largest = std::max(largest, c.blocks), max_batch = std::max(max_batch, c.batch);
  for (const PrefillCase& c : prefill) largest = std::max(largest, c.blocks);
  EngineOptions step;  // the largest step: its activations stay out of the KV budget
  step.max_num_seqs = max_batch;
  step.max_num_batched_tokens = o.chunk_size;
  step.enable_prefix_caching = false;
  BenchModel m;
  m.loaded = load_model(o.model, step, KvDemand{1, largest * block_size},
                        [&m](Backend& inner, int rank) {
                          auto timing = std::make_unique<TimingBackend>(inner);
                          if (rank == 0) m.timing = timing.get();
                          return std::unique_ptr<Backend>(std::move(timing));
                        });
  m.model = &m.loaded.model();
  m.runner = m.loaded.make_runner();
  m.device = m.loaded.device;
  m.weights = measure_weights(m.model->config(), m.model->weights());
  M3_LOG_INFO("bench: backend {}, {} layers, KV {} (index {}), pool {} blocks ({:.1f} MiB)", m.device,
              m.model->config().num_layers, kv_dtype_name(m.model->options().kv_dtype),
              kv_dtype_name(m.model->options().index_dtype), m.model->num_kv_blocks(),
              m.model->kv_pool_bytes() / 1048576.0);
  return m;
}

// --spec-drafter: the drafter of that directory on rank 0's timed backend, its weights the
// directory's files, or random ones in its config's shapes with --load-format dummy. A model cut
// to fewer layers (--num-layers) taps its last layer in place of those it lacks: the same work.
void attach_bench_drafter(BenchModel& m, const BenchLatencyOptions& o) {
  M3_CHECK(!o.spec_tokens.empty(), "--spec-drafter times the drafter beside the verification steps of --spec-tokens");
  M3_CHECK(m.loaded.ranks.size() == 1, "--spec-drafter: one rank only (the drafter runs beside rank 0)");
  const ModelConfig& config = m.model->config();
  DSparkConfig d = load_dspark_config(o.spec_drafter);
  for (int& l : d.target_layer_ids) l = std::min(l, config.num_layers - 1);
  DSparkWeights w = o.model.load_format == "dummy" ? make_dummy_dspark_weights(d, o.model.seed)
                                                   : load_dspark_weights(d, o.spec_drafter);
  const ModelWeights& tw = m.model->weights();
  M3_CHECK(tw.embed.dim(0) == config.vocab_size && tw.lm_head.out_features == config.vocab_size,
           "--spec-drafter: rank 0 must hold the whole embedding and lm_head");
  m.drafter = make_dspark_drafter(std::move(d), std::move(w), o.spec_drafter, config, m.model->backend(), tw.embed,
                                  tw.lm_head, m.model->num_kv_blocks(), m.model->block_size(), KvDType::kBF16);
  M3_LOG_INFO("bench: DSpark drafter {} ({} layers, taps {}), bf16 cache", o.spec_drafter,
              m.drafter->config().num_layers, fmt::join(m.drafter->config().target_layer_ids, ","));
}

// The GPU the reports' rates were measured on, by name.
std::string gpu_name() {
#if M3SERVE_WITH_CUDA
  const CudaDeviceInfo gpu = cuda_device_info();
  if (gpu.available) return gpu.name;
#endif
  return "unnamed";
}

nlohmann::json ops_json(const std::map<std::string, double>& seconds, int steps) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [name, s] : seconds) ops[name] = s * 1e3 / steps;
  return ops;
}

// A decode step's ops against their own byte floors (app/op_floors.h): calls and bytes per step,
// the wait's round trip (one per timed call), and where the rate is known each op's time less
// its waits over its bytes at that rate.
void add_op_floors(nlohmann::json& r, const TimingBackend& timing, int steps, double bandwidth) {
  nlohmann::json calls = nlohmann::json::object(), bytes = nlohmann::json::object();
  for (const auto& [name, n] : timing.op_calls()) calls[name] = n / steps;
  for (const auto& [name, b] : timing.op_bytes()) bytes[name] = b / steps;
  r["ops_calls"] = calls;
  r["ops_bytes"] = bytes;
  r["op_sync_ms"] = timing.sync_seconds() * 1e3;
  if (bandwidth <= 0) return;
  nlohmann::json ratio = nlohmann::json::object();
  for (const auto& [name, b] : timing.op_bytes())
    if (b > 0) ratio[name] = timing.busy_seconds(name) / (b / bandwidth);
  r["ops_floor_ratio"] = ratio;
}

// A prompt's ops against their FLOPs (app/op_floors.h): FLOPs per prompt, the rate each op's time
// less its waits gives, and where the peak is known that time over the FLOPs at the peak.
void add_op_flops(nlohmann::json& r, const TimingBackend& timing, double flops_peak) {
  nlohmann::json flops = nlohmann::json::object(), rate = nlohmann::json::object(), ratio = nlohmann::json::object();
  for (const auto& [name, f] : timing.op_flops()) {
    if (f <= 0) continue;
    const double busy = timing.busy_seconds(name);
    flops[name] = f;
    if (busy > 0) rate[name] = f / busy;
    if (flops_peak > 0) ratio[name] = busy / (f / flops_peak);
  }
  r["ops_flops"] = flops;
  r["ops_flops_per_s"] = rate;
  if (flops_peak > 0) r["ops_flop_floor_ratio"] = ratio;
}

// Runs fn warmup + iters times; returns each timed run's seconds.
template <class Fn>
std::vector<double> time_runs(int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> out;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = BenchClock::now();
    fn();
    out.push_back(std::chrono::duration<double>(BenchClock::now() - t0).count());
  }
  return out;
}

// One step's kernels as the GPU ran them (KernelTimeline): each one's start, from the first
// kernel's, its duration and its stream, and the step's span on the host's clock.
nlohmann::json record_timeline(KernelTimeline& timeline, const std::function<void()>& step) {
  const uint64_t begin = timeline.now();
  step();  // ends with the sampled ids' copy, so the GPU is done
  const uint64_t end = timeline.now();
  const std::vector<KernelSpan> spans = timeline.spans(begin, end);
  nlohmann::json kernels = nlohmann::json::array();
  const uint64_t t0 = spans.empty() ? begin : spans.front().start_ns;
  for (const KernelSpan& k : spans)
    kernels.push_back({{"name", k.name},
                       {"start_us", (k.start_ns - t0) * 1e-3},
                       {"us", (k.end_ns - k.start_ns) * 1e-3},
                       {"stream", k.stream}});
  return {{"host_span_us", (end - begin) * 1e-3}, {"kernels", kernels}};
}

nlohmann::json run_decode(BenchModel& m, const BenchLatencyOptions& o, const DecodeCase& c, double bandwidth,
                          KernelTimeline* timeline) {
  const ModelConfig& config = m.model->config();
  nlohmann::json r = {{"batch", c.batch}, {"context", c.context}, {"kv_blocks", c.blocks}};
  if (c.blocks > m.model->num_kv_blocks()) {
    r["status"] = "skipped: pool too large";
    return r;
  }
  const StepBatch batch = decode_batch(c.batch, c.context, m.model->block_size(), config.vocab_size);
  // The serving path's step: forward, sampling on the backend, the ids' copy (the one sync).
  const SampleBatch sampling = decode_rows(batch, o);
  std::vector<int32_t> ids(size_t(c.batch));
  std::vector<RowLogprobs> logprobs(sampling.logprobs.size());
  const auto step = [&] { m.runner->forward_sample(batch, sampling, ids.data(), logprobs.data(), {}, nullptr); };
  const double step_s = median(time_runs(o.warmup, o.iters, step));
  if (timeline != nullptr) r["kernel_timeline"] = record_timeline(*timeline, step);
  const double weight_bytes = m.weights.touched(c.batch);
  const double kv_bytes = decode_kv_bytes(config, m.model->kv_layout(), c.batch, c.context);
  const double floor_bytes = weight_bytes + kv_bytes;
  r["status"] = "ok";
  r["step_ms"] = step_s * 1e3;
  r["per_layer_us"] = step_s * 1e6 / config.num_layers;
  r["tokens_per_s"] = c.batch / step_s;
  r["weight_bytes"] = weight_bytes;
  r["kv_bytes"] = kv_bytes;
  r["floor_bytes"] = floor_bytes;
  r["achieved_bytes_per_s"] = floor_bytes / step_s;
  if (bandwidth > 0) {
    r["floor_ms"] = floor_bytes / bandwidth * 1e3;
    r["floor_ratio"] = step_s / (floor_bytes / bandwidth);
  }
  // Speculative decoding verifies 1 + k tokens a request in one step: the routed experts touched
  // grow with the tokens, the KV read barely. It beats plain decode, by the floor and before the
  // drafter's own cost, when the mean acceptance length (tokens a step, the target's own counted)
  // exceeds this step's floor over the decode step's.
  for (int k : parse_list(o.spec_tokens, "--spec-tokens")) {
    const int tokens = c.batch * (1 + k);
    const double w = m.weights.touched(tokens);
    const double kv_shared = step_kv_bytes(config, m.model->kv_layout(), c.batch, c.context, 1 + k, false);
    const double kv_distinct = step_kv_bytes(config, m.model->kv_layout(), c.batch, c.context, 1 + k, true);
    nlohmann::json v = {{"k", k},
                        {"tokens", tokens},
                        {"weight_bytes", w},
                        {"kv_bytes_shared_selection", kv_shared},
                        {"kv_bytes_distinct_selection", kv_distinct},
                        {"floor_bytes", w + kv_shared},
                        {"breakeven_acceptance_length", (w + kv_shared) / floor_bytes},
                        {"breakeven_acceptance_length_distinct_selection", (w + kv_distinct) / floor_bytes}};
    if (bandwidth > 0) {
      v["floor_ms"] = (w + kv_shared) / bandwidth * 1e3;
      v["floor_ms_distinct_selection"] = (w + kv_distinct) / bandwidth * 1e3;
    }
    // The step itself, timed as the engine runs it (the chunk of 1 + k tokens, every row sampled),
    // and what a user gets at the acceptance length --spec-acceptance, before the drafter's cost.
    const StepBatch verify = decode_batch(c.batch, c.context, m.model->block_size(), config.vocab_size, k);
    const SampleBatch verify_rows = greedy_rows(verify);
    std::vector<int32_t> verify_ids(verify_rows.rows.size());
    const double verify_s = median(time_runs(o.warmup, o.iters, [&] {
      m.runner->forward_sample(verify, verify_rows, verify_ids.data(), nullptr, {}, nullptr);
    }));
    v["step_ms"] = verify_s * 1e3;
    v["measured_breakeven_acceptance_length"] = verify_s / step_s;
    v["acceptance_length"] = o.spec_acceptance;
    v["tokens_per_s_per_user"] = o.spec_acceptance / verify_s;
    v["plain_tokens_per_s_per_user"] = 1.0 / step_s;
    if (m.drafter) {
      // The drafter's whole cost: its cache fed inside the verification step (the taps), then its
      // proposal step for every request (k drafts from a block of its block size).
      m.model->set_taps(m.drafter.get());
      const double with_taps_s = median(time_runs(o.warmup, o.iters, [&] {
        m.runner->forward_sample(verify, verify_rows, verify_ids.data(), nullptr, {}, nullptr);
      }));
      std::vector<std::vector<int32_t>> tables(c.batch);
      std::vector<DSparkBlock> blocks(c.batch);
      for (int s = 0; s < c.batch; ++s) {
        tables[s].assign(verify.page_table.begin() + int64_t(s) * verify.pages_per_seq,
                         verify.page_table.begin() + int64_t(s + 1) * verify.pages_per_seq);
        blocks[s].anchor = verify.token_ids[verify.query_start[s]];
        blocks[s].anchor_pos = c.context;
        blocks[s].block_table = tables[s];
        blocks[s].num_drafts = std::min(k, m.drafter->config().block_size);
      }
      const double draft_s = median(time_runs(o.warmup, o.iters, [&] { m.drafter->propose(blocks); }));
      m.model->set_taps(nullptr);
      nlohmann::json draft_ops = nlohmann::json::object();
      if (o.op_breakdown) {
        // The draft step's ops, each synchronised (m.timing wraps the backend the drafter runs on).
        m.timing->clear();
        m.timing->set_timing(true);
        for (int i = 0; i < o.iters; ++i) m.drafter->propose(blocks);
        m.timing->set_timing(false);
        draft_ops = ops_json(m.timing->op_seconds(), o.iters);
        m.timing->clear();
      }
      v["drafter"] = {{"verify_step_with_taps_ms", with_taps_s * 1e3},
                      {"taps_ms", (with_taps_s - verify_s) * 1e3},
                      {"draft_step_ms", draft_s * 1e3},
                      {"cycle_ms", (with_taps_s + draft_s) * 1e3},
                      {"tokens_per_s_per_user", o.spec_acceptance / (with_taps_s + draft_s)},
                      {"breakeven_acceptance_length", (with_taps_s + draft_s) / step_s},
                      {"draft_ops_ms", draft_ops}};
    }
    r["verification"].push_back(v);
  }
  if (o.op_breakdown) {
    m.timing->clear();
    m.timing->set_timing(true);
    for (int i = 0; i < o.iters; ++i) step();
    m.timing->set_timing(false);
    r["ops_ms"] = ops_json(m.timing->op_seconds(), o.iters);
    add_op_floors(r, *m.timing, o.iters, bandwidth);
  }
  return r;
}

nlohmann::json run_prefill(BenchModel& m, const BenchLatencyOptions& o, const PrefillCase& c, double flops_peak,
                           KernelTimeline* timeline) {
  const ModelConfig& config = m.model->config();
  nlohmann::json r = {{"prompt_len", c.len}, {"chunk_size", o.chunk_size}, {"kv_blocks", c.blocks}};
  if (c.blocks > m.model->num_kv_blocks()) {
    r["status"] = "skipped: pool too large";
    return r;
  }
  const std::vector<StepBatch> chunks = prefill_chunks(c.len, o.chunk_size, m.model->block_size(), config.vocab_size);
  std::vector<float> logits(config.vocab_size);
  // The last chunk's logits copy waits for the device, so the run's time covers every chunk.
  const auto prompt = [&] {
    for (const StepBatch& b : chunks) m.runner->forward(b, logits.data());
  };
  const double s = median(time_runs(std::min(o.warmup, 1), std::max(1, o.iters / 2), prompt));
  if (timeline != nullptr) r["kernel_timeline"] = record_timeline(*timeline, prompt);
  const double flops = prefill_flops(config, m.weights, c.len);
  r["status"] = "ok";
  r["time_ms"] = s * 1e3;
  r["per_layer_ms"] = s * 1e3 / config.num_layers;
  r["tokens_per_s"] = c.len / s;
  r["flops"] = flops;
  r["achieved_flops_per_s"] = flops / s;
  if (flops_peak > 0) {
    r["floor_ms"] = flops / flops_peak * 1e3;
    r["floor_ratio"] = s / (flops / flops_peak);
  }
  if (o.op_breakdown) {
    // One whole prompt (every chunk) with each op synchronised: ms per prompt, summed over chunks.
    m.timing->clear();
    m.timing->set_timing(true);
    prompt();
    m.timing->set_timing(false);
    r["ops_ms"] = ops_json(m.timing->op_seconds(), 1);
    add_op_flops(r, *m.timing, flops_peak);
  }
  return r;
}

void print_text(const nlohmann::json& out) {
  std::printf("%s: %d layers on %s, KV %s; weights: %.1f MB always + %d MoE layers x %.2f MB per expert, "
              "lm_head %.1f MB\n", out["model"].get<std::string>().c_str(), out["num_layers"].get<int>(),
              out["device"].get<std::string>().c_str(), out["kv_cache_dtype"].get<std::string>().c_str(),
              out["weights"]["always_bytes"].get<double>() / 1e6, out["weights"]["moe_layers"].get<int>(),
              out["weights"]["expert_bytes"].get<double>() / 1e6, out["weights"]["lm_head_bytes"].get<double>() / 1e6);
  if (out["bandwidth_bytes_per_s"].get<double>() > 0)
    std::printf("decode floor at %.1f GB/s (%s)\n", out["bandwidth_bytes_per_s"].get<double>() / 1e9,
                out["bandwidth_source"].get<std::string>().c_str());
  const nlohmann::json& sampling = out["sampling"];
  std::printf("decode sampling: %s, logprobs %d\n",
              sampling["temperature"].get<double>() > 0
                  ? fmt::format("temperature {:g}, top_k {}, top_p {:g}", sampling["temperature"].get<float>(),
                                sampling["top_k"].get<int>(), sampling["top_p"].get<float>())
                        .c_str()
                  : "greedy",
              sampling["logprobs"].get<int>());
  std::printf("\ndecode %7s %6s %10s %10s %10s %11s %11s %9s %9s\n", "context", "batch", "step_ms", "layer_us", "tok/s",
              "floor_MB", "GB/s", "floor_ms", "x_floor");
  for (const auto& r : out["decode"]) {
    if (r["status"] != "ok") {
      std::printf("       %7d %6d  %s\n", r["context"].get<int>(), r["batch"].get<int>(),
                  r["status"].get<std::string>().c_str());
      continue;
    }
    std::printf("       %7d %6d %10.3f %10.1f %10.1f %11.2f %11.2f %9s %9s\n", r["context"].get<int>(),
                r["batch"].get<int>(), r["step_ms"].get<double>(), r["per_layer_us"].get<double>(),
                r["tokens_per_s"].get<double>(), r["floor_bytes"].get<double>() / 1e6,
                r["achieved_bytes_per_s"].get<double>() / 1e9,
                r.contains("floor_ms") ? fmt::format("{:.3f}", r["floor_ms"].get<double>()).c_str() : "-",
                r.contains("floor_ratio") ? fmt::format("{:.2f}", r["floor_ratio"].get<double>()).c_str() : "-");
    if (r.contains("verification")) {
      for (const auto& v : r["verification"])
        std::printf("         verify 1+%d tokens: floor %.2f MB%s, speculation pays from acceptance length %.2f "
                    "(with distinct block selections: %.2f MB, %.2f); measured %.3f ms, pays from %.2f; at "
                    "acceptance %.2f %.1f tok/s per user vs %.1f plain (before the drafter)\n",
                    v["k"].get<int>(), v["floor_bytes"].get<double>() / 1e6,
                    v.contains("floor_ms") ? fmt::format(", {:.3f} ms", v["floor_ms"].get<double>()).c_str() : "",
                    v["breakeven_acceptance_length"].get<double>(),
                    (v["weight_bytes"].get<double>() + v["kv_bytes_distinct_selection"].get<double>()) / 1e6,
                    v["breakeven_acceptance_length_distinct_selection"].get<double>(), v["step_ms"].get<double>(),
                    v["measured_breakeven_acceptance_length"].get<double>(), v["acceptance_length"].get<double>(),
                    v["tokens_per_s_per_user"].get<double>(), v["plain_tokens_per_s_per_user"].get<double>());
      for (const auto& v : r["verification"])
        if (v.contains("drafter"))
          std::printf("         drafter k=%d: taps %.3f ms in the verification step, draft step %.3f ms: a cycle of "
                      "%.3f ms, %.1f tok/s per user at acceptance %.2f, pays from %.2f\n",
                      v["k"].get<int>(), v["drafter"]["taps_ms"].get<double>(),
                      v["drafter"]["draft_step_ms"].get<double>(), v["drafter"]["cycle_ms"].get<double>(),
                      v["drafter"]["tokens_per_s_per_user"].get<double>(), v["acceptance_length"].get<double>(),
                      v["drafter"]["breakeven_acceptance_length"].get<double>());
    }
    if (r.contains("ops_ms")) {
      std::string line;
      for (const auto& [name, ms] : r["ops_ms"].items()) line += fmt::format("  {} {:.3f}", name, ms.get<double>());
      std::printf("         ops ms/step (synchronised per op):%s\n", line.c_str());
    }
    if (r.contains("ops_floor_ratio")) {
      std::string line;
      for (const auto& [name, x] : r["ops_floor_ratio"].items())
        line += fmt::format("  {} {:.2f} ({:.2f} MB)", name, x.get<double>(), r["ops_bytes"][name].get<double>() / 1e6);
      std::printf("         ops x own byte floor (less a %.1f us wait a call):%s\n", r["op_sync_ms"].get<double>() * 1e3,
                  line.c_str());
    }
  }
  std::printf("\nprefill %7s %6s %10s %10s %12s %11s %9s %9s\n", "tokens", "chunk", "time_ms", "tok/s", "TFLOP",
              "TFLOP/s", "floor_ms", "x_floor");
  for (const auto& r : out["prefill"]) {
    if (r["status"] != "ok") {
      std::printf("        %7d  %s\n", r["prompt_len"].get<int>(), r["status"].get<std::string>().c_str());
      continue;
    }
    std::printf("        %7d %6d %10.2f %10.1f %12.4f %11.4f %9s %9s\n", r["prompt_len"].get<int>(),
                r["chunk_size"].get<int>(), r["time_ms"].get<double>(), r["tokens_per_s"].get<double>(),
                r["flops"].get<double>() / 1e12, r["achieved_flops_per_s"].get<double>() / 1e12,
                r.contains("floor_ms") ? fmt::format("{:.2f}", r["floor_ms"].get<double>()).c_str() : "-",
                r.contains("floor_ratio") ? fmt::format("{:.2f}", r["floor_ratio"].get<double>()).c_str() : "-");
    if (r.contains("ops_ms")) {
      std::string line;
      for (const auto& [name, ms] : r["ops_ms"].items()) line += fmt::format("  {} {:.2f}", name, ms.get<double>());
      std::printf("         ops ms/prompt (synchronised per op):%s\n", line.c_str());
    }
    if (r.contains("ops_flops_per_s")) {
      std::string line;
      for (const auto& [name, rate] : r["ops_flops_per_s"].items()) {
        line += fmt::format("  {} {:.4g}", name, rate.get<double>() / 1e12);
        if (r.contains("ops_flop_floor_ratio"))
          line += fmt::format(" (x{:.2f})", r["ops_flop_floor_ratio"][name].get<double>());
      }
      std::printf("         ops TFLOP/s (x own FLOP floor):%s\n", line.c_str());
    }
  }
}

void run(BenchLatencyOptions o) {
  locate_model(o.model);
  M3_CHECK(o.warmup >= 0 && o.iters >= 1, "--warmup must be >= 0 and --iters >= 1");
  M3_CHECK(o.model.nnodes == 1,
           "bench latency --nnodes {}: it times ops of one host's ranks; over several hosts use bench throughput or "
           "bench serve",
           o.model.nnodes);
  M3_CHECK(o.model.kv_offloading_size.empty(),
           "bench latency --kv-offloading-size: it drives the model one step at a time, without the engine's prefix "
           "cache that the host tier extends; time the tier with bench throughput or bench serve");
  M3_CHECK(o.chunk_size >= 1, "--chunk-size must be >= 1");
  const std::vector<int> batches = parse_list(o.batch_sizes, "--batch-sizes");
  const std::vector<int> contexts = parse_list(o.context_lens, "--context-lens");
  const std::vector<int> prompts = o.prefill_lens.empty() ? std::vector<int>{} : parse_list(o.prefill_lens, "--prefill-lens");
  parse_list(o.spec_tokens, "--spec-tokens");  // checked before the model loads; each decode case reads it
  const int bs = load_model_config(o.model.model_dir).index_block_size;
  std::vector<DecodeCase> decode;
  for (int c : contexts)
    for (int b : batches) {
      int k_max = 0;
      for (int k : parse_list(o.spec_tokens, "--spec-tokens")) k_max = std::max(k_max, k);
      decode.push_back({b, c, int64_t(b) * ((c + k_max + bs - 1) / bs)});
    }
  std::vector<PrefillCase> prefill;
  for (int l : prompts) prefill.push_back({l, (l + bs - 1) / bs});
  // CUPTI traces a graph's kernel nodes only if it was on when the graph was built: on from before
  // the model loads, so this run's other timings carry its (small) tracing cost too.
  std::unique_ptr<KernelTimeline> timeline;
  if (o.kernel_timeline) {
    M3_CHECK(o.model.device == "cuda", "--kernel-timeline records GPU kernels: it needs --device cuda");
    timeline = std::make_unique<KernelTimeline>();
  }
  BenchModel m = load_bench_model(o, decode, prefill, bs);
  const ModelConfig& config = m.model->config();
  if (!o.spec_drafter.empty()) attach_bench_drafter(m, o);
  for (const DecodeCase& c : decode)
    M3_CHECK(c.context <= config.max_position_embeddings, "--context-lens {} exceeds max_position_embeddings {}",
             c.context, config.max_position_embeddings);
  for (const PrefillCase& c : prefill)
    M3_CHECK(c.len <= config.max_position_embeddings, "--prefill-lens {} exceeds max_position_embeddings {}", c.len,
             config.max_position_embeddings);
  // The floor's rate: as given, else this device's copy rate measured now (bytes read plus written
  // a second by a copy far larger than its caches: on the GPU a device-to-device copy, on the
  // CPU the backend's threads copying host memory).
  std::string bandwidth_source = "--bandwidth";
  double bandwidth = o.bandwidth;
  if (bandwidth < 0) {
    const bool gpu = m.device == "cuda";
    bandwidth = m.timing->measure_copy_rate(int64_t{1} << (gpu ? 28 : 29), gpu ? 10 : 5);
    bandwidth_source = gpu ? fmt::format("measured copy rate of this GPU ({})", gpu_name())
                           : fmt::format("measured copy rate of this machine ({} threads)", omp_get_max_threads());
  }
  const double flops_peak = o.flops >= 0 ? o.flops : (m.device == "cuda" ? 7.6e14 : 0.0);

  nlohmann::json out = {
      {"model", o.model.model_dir},
      {"load_format", o.model.load_format},
      {"device", m.device},
      {"cuda_graphs", m.device == "cuda" && !o.model.enforce_eager},  // decode steps replayed from graphs
      {"batch_invariant", o.model.batch_invariant},
      {"num_layers", config.num_layers},
      {"num_sparse_layers", config.num_sparse_layers()},
      {"activation_dtype", std::string(dtype_name(m.model->options().activation_dtype))},
      {"kv_cache_dtype", std::string(kv_dtype_name(m.model->options().kv_dtype))},
      {"index_dtype", std::string(kv_dtype_name(m.model->options().index_dtype))},
      {"kv_pool_blocks", m.model->num_kv_blocks()},
      {"bandwidth_bytes_per_s", bandwidth},
      {"bandwidth_source", bandwidth_source},
      {"peak_flops_per_s", flops_peak},
      {"kernel_timeline", o.kernel_timeline},
      {"sampling", {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"logprobs", o.logprobs}}},
      {"weights",
       {{"always_bytes", m.weights.always}, {"expert_bytes", m.weights.expert}, {"moe_layers", m.weights.moe_layers},
        {"num_experts", m.weights.num_experts}, {"experts_per_token", m.weights.experts_per_token},
        {"embed_row_bytes", m.weights.embed_row}, {"lm_head_bytes", m.weights.lm_head},
        {"active_params_per_token", m.weights.active_params}, {"lm_head_params", m.weights.lm_head_params}}},
      {"decode", nlohmann::json::array()},
      {"prefill", nlohmann::json::array()}};
  for (const DecodeCase& c : decode) {
    out["decode"].push_back(run_decode(m, o, c, bandwidth, timeline.get()));
    if (!o.json) std::fprintf(stderr, "decode context %d batch %d done\n", c.context, c.batch);
  }
  for (const PrefillCase& c : prefill) {
    out["prefill"].push_back(run_prefill(m, o, c, flops_peak, timeline.get()));
    if (!o.json) std::fprintf(stderr, "prefill %d done\n", c.len);
  }
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    print_text(out);
  }
}

}  // namespace

void register_bench_latency(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");  // created by register_bench_serve
  auto* cmd = bench->add_subcommand(
      "latency",
      "decode step time per (batch, context) against the byte floor, and prefill tokens/s against the FLOP "
      "floor (the formulas are at the top of app/cmd_bench_latency.cc and in docs/gpu-backend-notes.md)");
  auto o = std::make_shared<BenchLatencyOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--batch-sizes", o->batch_sizes, "decode: comma-separated batch sizes")->capture_default_str();
  cmd->add_option("--context-lens", o->context_lens, "decode: comma-separated context lengths (tokens)")
      ->capture_default_str();
  cmd->add_option("--prefill-lens", o->prefill_lens, "prefill: comma-separated prompt lengths (empty: none)")
      ->capture_default_str();
  cmd->add_option("--chunk-size", o->chunk_size, "prefill: tokens per step")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps before each case")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed steps per decode case (median reported; prefill: iters / 2 runs)")
      ->capture_default_str();
  cmd->add_option("--bandwidth", o->bandwidth,
                  "bytes/s of the decode floor (default: the device's copy rate, measured after the model loads: "
                  "a device-to-device copy on cuda, the backend's threads copying host memory on cpu)");
  cmd->add_option("--flops", o->flops, "FLOP/s of the prefill floor (default 7.6e14 on cuda: H200 bf16; none on cpu)");
  cmd->add_flag("--kernel-timeline", o->kernel_timeline,
                "one more decode step of each case, and one more prompt of each prefill case, recorded kernel by "
                "kernel with CUPTI (start, duration, stream: decode[].kernel_timeline and prefill[].kernel_timeline "
                "in the JSON; scripts/kernel_timeline_summary.py reads them); needs --device cuda, and CUPTI stays "
                "on for the whole run");
  cmd->add_flag("--op-breakdown,!--no-op-breakdown", o->op_breakdown,
                "decode: one more pass of iters steps, synchronised after every op, timed per op")
      ->capture_default_str();
  cmd->add_option("--spec-acceptance", o->spec_acceptance,
                  "with --spec-tokens: the mean acceptance length (tokens a step, the target's own counted) the "
                  "verification step's tokens/s per user is quoted at (default 3.2)")
      ->capture_default_str();
  cmd->add_option("--spec-tokens", o->spec_tokens,
                  "decode: also the byte floor of a speculative verification step of 1 + k tokens a request, "
                  "for each k (comma-separated), and the acceptance length from which it beats plain decode "
                  "(the drafter not counted)");
  cmd->add_option("--spec-drafter", o->spec_drafter,
                  "with --spec-tokens: a DSpark drafter's directory (its config.json; its weights, or random ones "
                  "with --load-format dummy) whose cost is timed beside each verification step: its cache fed "
                  "inside the step, and its proposal step");
  cmd->add_option("--temperature", o->temperature, "decode: every request's temperature (0: greedy)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "decode: every request's top_k (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "decode: every request's top_p, in (0, 1]")
      ->check(CLI::Range(1e-6f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--logprobs", o->logprobs,
                  "decode: top logprobs each drawn token reports (0-20; the token's own logprob and rank too), "
                  "answered beside the draw; -1: none")
      ->check(CLI::Range(-1, kMaxTopLogprobs))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace m3::app
