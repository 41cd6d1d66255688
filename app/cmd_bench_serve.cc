// m3serve bench serve: the serving engine under load, in process (no HTTP): streaming clients
// at several concurrency levels on random prompts, then a multi-turn workload whose turns re-send
// the conversation so far after a shared system prompt (what agentic clients do), reporting
// requests/s, output tokens/s, TTFT, inter-token latency, preemptions and the prefix-cache hit
// rate. The HTTP layer's own cost is not included; it measures what the engine can deliver.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "model/config.h"

namespace m3::app {
namespace {

using BenchClock = std::chrono::steady_clock;

struct BenchServeOptions {
  ModelOptions model;
  std::string concurrency = "1,8,64";
  int num_prompts = 0;  // per level; 0: max(16, 2 x concurrency)
  int input_len = 256;
  int output_len = 64;
  double range_ratio = 0.5;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  EngineOptions engine;
  int conversations = 8;
  int turns = 4;
  int system_len = 512;
  int user_len = 64;
  uint64_t seed = 0;
  bool json = false;
};

// One finished request as a client saw it.
struct Sample {
  double ttft_s = 0.0;
  std::vector<double> itl_s;
  double e2e_s = 0.0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  int cached_tokens = 0;
  FinishReason reason = FinishReason::kNone;
  std::vector<int32_t> tokens;  // the output
};

// Submits one request and blocks until it finishes, timing every streamed output.
Sample run_request(EngineCore& engine, EngineRequest request) {
  struct Shared {
    std::promise<void> done;
    Sample sample;
    BenchClock::time_point start, last;
    bool first = true;
  };
  auto shared = std::make_shared<Shared>();
  shared->sample.prompt_tokens = static_cast<int>(request.prompt_token_ids.size());
  shared->start = shared->last = BenchClock::now();
  engine.add_request(std::move(request), [shared](const RequestOutput& out) {
    const auto now = BenchClock::now();
    Sample& s = shared->sample;
    if (!out.new_token_ids.empty()) {
      if (shared->first) {
        s.ttft_s = std::chrono::duration<double>(now - shared->start).count();
        shared->first = false;
      } else {
        s.itl_s.push_back(std::chrono::duration<double>(now - shared->last).count());
      }
      shared->last = now;
      s.output_tokens += static_cast<int>(out.new_token_ids.size());
      s.tokens.insert(s.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
    if (out.finished) {
      s.e2e_s = std::chrono::duration<double>(now - shared->start).count();
      s.cached_tokens = out.num_cached_prompt_tokens;
      s.reason = out.finish_reason;
      shared->done.set_value();
    }
  });
  shared->done.get_future().wait();
  return shared->sample;
}

struct Report {
  std::string name;
  int concurrency = 0;
  int requests = 0;
  double wall_s = 0.0;
  uint64_t input_tokens = 0, output_tokens = 0;
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p99_ms = 0, itl_mean_ms = 0, itl_p99_ms = 0;
  uint64_t preemptions = 0, cache_queries = 0, cache_hits = 0;
  int failed = 0;

  double req_per_s() const { return requests / wall_s; }
  double out_tok_per_s() const { return output_tokens / wall_s; }
  double hit_rate() const { return cache_queries ? double(cache_hits) / double(cache_queries) : 0.0; }
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5))];
}

double mean(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return v.empty() ? 0.0 : sum / v.size();
}

Report summarise(std::string name, int concurrency, const std::vector<Sample>& samples, double wall_s,
                 const EngineStats& before, const EngineStats& after) {
  Report r;
  r.name = std::move(name);
  r.concurrency = concurrency;
  r.requests = static_cast<int>(samples.size());
  r.wall_s = wall_s;
  std::vector<double> ttft, itl;
  for (const Sample& s : samples) {
    r.input_tokens += s.prompt_tokens;
    r.output_tokens += s.output_tokens;
    r.failed += s.reason != FinishReason::kLength && s.reason != FinishReason::kStop;
    ttft.push_back(s.ttft_s * 1e3);
    for (double x : s.itl_s) itl.push_back(x * 1e3);
  }
  r.ttft_mean_ms = mean(ttft);
  r.ttft_p50_ms = percentile(ttft, 0.5);
  r.ttft_p99_ms = percentile(ttft, 0.99);
  r.itl_mean_ms = mean(itl);
  r.itl_p99_ms = percentile(itl, 0.99);
  r.preemptions = after.num_preemptions - before.num_preemptions;
  r.cache_queries = after.prefix_cache_queries_tokens - before.prefix_cache_queries_tokens;
  r.cache_hits = after.prefix_cache_hits_tokens - before.prefix_cache_hits_tokens;
  return r;
}

std::vector<int> parse_levels(const std::string& text) {
  std::vector<int> levels;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int value = 0;
    try {
      value = std::stoi(item);
    } catch (const std::exception&) {
      fail("--concurrency: '{}' is not a number (expected e.g. 1,8,64)", item);
    }
    M3_CHECK(value >= 1, "--concurrency: levels must be >= 1, got {}", value);
    levels.push_back(value);
  }
  M3_CHECK(!levels.empty(), "--concurrency: no level given");
  return levels;
}

class TokenSource {
 public:
  TokenSource(uint64_t seed, int vocab) : rng_(seed), token_(3, vocab - 1) {}
  std::vector<int32_t> tokens(int n) {
    std::vector<int32_t> out(n);
    for (int32_t& t : out) t = token_(rng_);
    return out;
  }
  int length(int nominal, double range_ratio) {
    const int lo = std::max(1, static_cast<int>(nominal * (1.0 - range_ratio)));
    const int hi = std::max(lo, static_cast<int>(nominal * (1.0 + range_ratio)));
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }

 private:
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int32_t> token_;
};

EngineRequest make_request(std::string id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.id = std::move(id);
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;  // fixed output lengths, as vLLM's random-dataset benchmark
  return r;
}

Report random_level(EngineCore& engine, const BenchServeOptions& o, int concurrency, int level_index) {
  const int n = o.num_prompts > 0 ? o.num_prompts : std::max(16, 2 * concurrency);
  TokenSource source(o.seed * 1000003 + level_index, engine.vocab_size());
  std::vector<EngineRequest> requests;
  for (int i = 0; i < n; ++i) {
    const int in = source.length(o.input_len, o.range_ratio);
    const int out = source.length(o.output_len, o.range_ratio);
    requests.push_back(make_request(fmt::format("bench-{}-{}", concurrency, i), source.tokens(in), out));
  }
  std::vector<Sample> samples(n);
  std::atomic<int> next{0};
  const EngineStats before = engine.stats();
  const auto t0 = BenchClock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (int i; (i = next++) < n;) samples[i] = run_request(engine, std::move(requests[i]));
    });
  }
  for (auto& t : clients) t.join();
  const double wall = std::chrono::duration<double>(BenchClock::now() - t0).count();
  return summarise(fmt::format("random in~{} out~{}", o.input_len, o.output_len), concurrency, samples, wall,
                   before, engine.stats());
}

// Each conversation: shared system prompt + (user message, answer) turns, the whole history
// re-sent every turn. Conversations run concurrently.
Report multi_turn(EngineCore& engine, const BenchServeOptions& o) {
  TokenSource shared_source(o.seed * 7919 + 17, engine.vocab_size());
  const std::vector<int32_t> system = shared_source.tokens(o.system_len);
  std::vector<std::vector<Sample>> per_conv(o.conversations);
  const EngineStats before = engine.stats();
  const auto t0 = BenchClock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < o.conversations; ++c) {
    clients.emplace_back([&, c] {
      TokenSource source(o.seed * 31 + 1000 + c, engine.vocab_size());
      std::vector<int32_t> history = system;
      for (int t = 0; t < o.turns; ++t) {
        const auto user = source.tokens(o.user_len);
        history.insert(history.end(), user.begin(), user.end());
        if (static_cast<int64_t>(history.size()) + o.output_len > engine.max_model_len()) break;
        Sample s = run_request(engine, make_request(fmt::format("conv-{}-{}", c, t), history, o.output_len));
        history.insert(history.end(), s.tokens.begin(), s.tokens.end());  // the answer joins the history
        per_conv[c].push_back(std::move(s));
      }
    });
  }
  for (auto& t : clients) t.join();
  const double wall = std::chrono::duration<double>(BenchClock::now() - t0).count();
  std::vector<Sample> all;
  for (auto& v : per_conv) all.insert(all.end(), v.begin(), v.end());
  return summarise(fmt::format("multi-turn {}x{} sys {}", o.conversations, o.turns, o.system_len), o.conversations,
                   all, wall, before, engine.stats());
}

void print_table(const std::vector<Report>& reports) {
  std::printf("%-26s %5s %5s %9s %9s %8s %8s %10s %9s %9s %9s %8s %8s\n", "case", "conc", "reqs", "in_tok",
              "out_tok", "wall_s", "req/s", "out_tok/s", "ttft_ms", "ttft_p99", "itl_ms", "preempt", "hit%");
  for (const Report& r : reports) {
    std::printf("%-26s %5d %5d %9llu %9llu %8.2f %8.2f %10.1f %9.1f %9.1f %9.2f %8llu %8.1f\n", r.name.c_str(),
                r.concurrency, r.requests, static_cast<unsigned long long>(r.input_tokens),
                static_cast<unsigned long long>(r.output_tokens), r.wall_s, r.req_per_s(), r.out_tok_per_s(),
                r.ttft_mean_ms, r.ttft_p99_ms, r.itl_mean_ms, static_cast<unsigned long long>(r.preemptions),
                100.0 * r.hit_rate());
    if (r.failed) std::printf("  (%d requests did not finish normally)\n", r.failed);
  }
}

nlohmann::json to_json(const std::vector<Report>& reports) {
  nlohmann::json out = nlohmann::json::array();
  for (const Report& r : reports) {
    out.push_back({{"case", r.name}, {"concurrency", r.concurrency}, {"requests", r.requests},
                   {"input_tokens", r.input_tokens}, {"output_tokens", r.output_tokens}, {"wall_s", r.wall_s},
                   {"requests_per_s", r.req_per_s()}, {"output_tokens_per_s", r.out_tok_per_s()},
                   {"ttft_mean_ms", r.ttft_mean_ms}, {"ttft_p50_ms", r.ttft_p50_ms}, {"ttft_p99_ms", r.ttft_p99_ms},
                   {"itl_mean_ms", r.itl_mean_ms}, {"itl_p99_ms", r.itl_p99_ms}, {"preemptions", r.preemptions},
                   {"prefix_cache_queries_tokens", r.cache_queries}, {"prefix_cache_hits_tokens", r.cache_hits},
                   {"prefix_cache_hit_rate", r.hit_rate()}, {"failed", r.failed}});
  }
  return out;
}

void run(BenchServeOptions o) {
  locate_model(o.model);
  const std::vector<int> levels = parse_levels(o.concurrency);
  M3_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len and --output-len must be >= 1");
  M3_CHECK(o.range_ratio >= 0.0 && o.range_ratio < 1.0, "--range-ratio must be in [0, 1)");
  M3_CHECK(o.conversations >= 0 && o.turns >= 1, "--conversations must be >= 0 and --turns >= 1");
  // Enough KV for the largest level's sequences to all run at once (no preemption by default), and
  // one sequence more of room for the blocks the prefix cache keeps.
  const int max_level = std::min(*std::max_element(levels.begin(), levels.end()), o.engine.max_num_seqs);
  const int64_t longest = static_cast<int64_t>((o.input_len + o.output_len) * (1.0 + o.range_ratio)) + 1;
  const int64_t conv = o.system_len + int64_t(o.turns) * (o.user_len + o.output_len);
  const int64_t per_seq = std::max(longest, conv);
  LoadedModel loaded =
      load_model(o.model, o.engine, KvDemand{std::max<int64_t>(max_level, o.conversations) + 1, per_seq});
  if (loaded.follower()) return follow_node_zero(loaded, o.model, o.engine);
  std::unique_ptr<EngineCore> core = make_engine(loaded, o.model, o.engine);
  EngineCore& engine = *core;
  engine.start();

  std::vector<Report> reports;
  for (std::size_t i = 0; i < levels.size(); ++i) {
    reports.push_back(random_level(engine, o, levels[i], static_cast<int>(i)));
    if (!o.json) std::fprintf(stderr, "concurrency %d done\n", levels[i]);
  }
  if (o.conversations > 0) reports.push_back(multi_turn(engine, o));
  engine.shutdown(true);
  const EngineStats end = engine.stats();
  M3_CHECK(end.num_used_kv_blocks == 0, "bench: {} KV blocks still referenced after shutdown", end.num_used_kv_blocks);
  if (o.json) {
    std::printf("%s\n", to_json(reports).dump(2).c_str());
  } else {
    print_table(reports);
  }
}

}  // namespace

void register_bench_serve(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* cmd = bench->add_subcommand(
      "serve", "the serving engine in process: streaming clients at several concurrency levels + a multi-turn "
               "workload (requests/s, output tokens/s, TTFT, ITL, prefix-cache hit rate)");
  auto o = std::make_shared<BenchServeOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--concurrency", o->concurrency, "comma-separated client counts")->capture_default_str();
  cmd->add_option("--num-prompts", o->num_prompts, "requests per level (0: max(16, 2 x concurrency))")
      ->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "mean prompt tokens")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "mean output tokens (eos ignored)")->capture_default_str();
  cmd->add_option("--range-ratio", o->range_ratio, "lengths uniform in len x [1 - r, 1 + r]")->capture_default_str();
  add_engine_options(*cmd, o->engine);
  cmd->add_option("--conversations", o->conversations, "multi-turn: concurrent conversations (0: skip)")
      ->capture_default_str();
  cmd->add_option("--turns", o->turns, "multi-turn: turns per conversation")->capture_default_str();
  cmd->add_option("--system-len", o->system_len, "multi-turn: shared system prompt tokens")->capture_default_str();
  cmd->add_option("--user-len", o->user_len, "multi-turn: tokens per user message")->capture_default_str();
  cmd->add_option("--bench-seed", o->seed, "workload seed")->capture_default_str();
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace m3::app
