// m3serve bench agentic: AgentX-style replay of agent traces against any OpenAI-compatible server
// (m3serve, vLLM, ...), a seeded generator of synthetic traces, and the Pareto plot of sweeps.
// The client is loadgen/ (docs/agentic-bench.md); this file reads the options, picks the word
// pool (the server's tokenizer when --tokenizer is given), runs the levels, writes the reports.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "loadgen/http_stream_client.h"
#include "loadgen/plot.h"
#include "loadgen/progress.h"
#include "loadgen/prometheus.h"
#include "loadgen/replay.h"
#include "loadgen/report.h"
#include "loadgen/trace.h"
#include "loadgen/trace_generator.h"
#include "text/tokenizer.h"

namespace m3::app {
namespace {

using nlohmann::json;

struct BenchAgenticOptions {
  std::string traces;
  std::string generate_traces;
  loadgen::GeneratorOptions generator;
  std::string base_url = "http://127.0.0.1:8000";
  std::string api_key;
  std::string model;
  std::string endpoint = "chat";
  std::string concurrency = "1";
  double duration_s = 0;
  int max_replays = 0;
  double think_time_scale = 1.0;
  double idle_cap_s = 10.0;
  std::string idle_cap_mode = "system";
  int warmup_requests = 0;
  double trajectory_start_min = 0, trajectory_start_max = 0;
  int64_t max_context_length = 0;
  int num_gpus = 1;
  int request_timeout_s = 600;
  std::string tokenizer;
  std::string label;
  bool json = false;
  bool detailed = false;
  bool no_progress = false;
  std::string output;
  std::string plot_svg, plot_png, plot_title = "AgentX-style Pareto frontier";
  std::vector<std::string> results;  // plot these result files instead of running
  std::string labels;                // comma-separated series labels for the plot
};

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Words of the server's vocabulary that are one token with their leading space, so a prompt of
// n words is n tokens (the tokenizer's pre-split keeps " word" whole whatever comes next).
loadgen::WordPool tokenizer_words(const std::string& model_dir) {
  const text::Tokenizer tokenizer = text::Tokenizer::load(model_dir);
  loadgen::WordPool pool;
  for (int32_t id = 0; id < tokenizer.vocab_size() && pool.words.size() < 4096; ++id) {
    const std::optional<std::string> bytes = tokenizer.token_bytes(id);
    if (!bytes || bytes->size() < 3 || bytes->size() > 9 || (*bytes)[0] != ' ') continue;
    bool letters = true;
    for (size_t i = 1; i < bytes->size(); ++i) letters = letters && (*bytes)[i] >= 'a' && (*bytes)[i] <= 'z';
    if (!letters) continue;
    const std::vector<int32_t> ids = tokenizer.encode(*bytes, false);
    if (ids.size() == 1 && ids[0] == id) pool.words.push_back(*bytes);
  }
  M3_CHECK(pool.words.size() >= 16, "--tokenizer {}: fewer than 16 one-token words in its vocabulary", model_dir);
  return pool;
}

loadgen::ServerCounters scrape(const loadgen::Endpoint& endpoint, const std::string& api_key) {
  std::string body;
  const loadgen::HttpResult r = loadgen::http_request(endpoint, "/metrics", "", api_key, std::chrono::seconds(30),
                                                      [&](const char* d, size_t n) { body.append(d, n); });
  loadgen::ServerCounters c;
  if (r.status != 200) return c;
  const auto metrics = loadgen::parse_prometheus_text(body);
  c.available = metrics.count("vllm:prefix_cache_queries_total") || metrics.count("vllm:prefix_cache_queries");
  c.prefix_cache_hits = loadgen::metric_value(metrics, "vllm:prefix_cache_hits");
  c.prefix_cache_queries = loadgen::metric_value(metrics, "vllm:prefix_cache_queries");
  c.prompt_tokens = loadgen::metric_value(metrics, "vllm:prompt_tokens");
  c.generation_tokens = loadgen::metric_value(metrics, "vllm:generation_tokens");
  return c;
}

// The first model /v1/models lists, when --model is not given.
std::string served_model(const loadgen::Endpoint& endpoint, const std::string& api_key) {
  std::string body;
  const loadgen::HttpResult r = loadgen::http_request(endpoint, "/v1/models", "", api_key, std::chrono::seconds(30),
                                                      [&](const char* d, size_t n) { body.append(d, n); });
  M3_CHECK(r.status == 200, "bench agentic: GET /v1/models failed ({}); pass --model",
           r.status == 0 ? r.error : fmt::format("HTTP {}", r.status));
  const json j = json::parse(body, nullptr, false);
  M3_CHECK(j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
               j["data"][0].contains("id"),
           "bench agentic: /v1/models lists no model; pass --model");
  return j["data"][0]["id"].get<std::string>();
}

void print_level(const loadgen::RunSummary& s) {
  std::fprintf(stderr,
               "c=%d  requests %lld sent, %lld ok, %lld failed, %lld skipped | TTFT p50 %.1f ms p90 %.1f ms | "
               "TPOT p50 %.2f ms | E2EL p90 %.0f ms | interactivity %.1f tok/s/user | total %.0f tok/s "
               "(%.0f /GPU) | hit rate server %.3f usage %.3f theoretical %.3f\n",
               s.concurrency, static_cast<long long>(s.sent), static_cast<long long>(s.completed),
               static_cast<long long>(s.failed), static_cast<long long>(s.skipped), s.ttft_s.p50 * 1e3,
               s.ttft_s.p90 * 1e3, s.tpot_s.p50 * 1e3, s.e2el_s.p90 * 1e3, s.interactivity, s.total_tps,
               s.total_tps / s.num_gpus, s.server_hit_rate, s.usage_cached_rate, s.theoretical_hit_rate);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  M3_CHECK(out.good(), "cannot write '{}'", path);
  out << bytes;
  M3_CHECK(out.good(), "writing '{}' failed", path);
}

std::vector<loadgen::PlotSeries> series_of(const std::vector<json>& reports, const std::vector<std::string>& labels) {
  std::vector<loadgen::PlotSeries> out;
  for (size_t i = 0; i < reports.size(); ++i) {
    loadgen::PlotSeries s;
    s.label = i < labels.size() ? labels[i] : reports[i].value("label", fmt::format("run {}", i + 1));
    for (const json& run : reports[i].at("runs")) {
      s.points.push_back({run.at("interactivity_tok_s_user").get<double>(),
                          run.at("throughput").at("total_tok_s_per_gpu").get<double>(),
                          run.at("concurrency").get<int>()});
    }
    out.push_back(std::move(s));
  }
  return out;
}

void plot(const BenchAgenticOptions& o, const std::vector<json>& reports) {
  const std::vector<loadgen::PlotSeries> series = series_of(reports, split(o.labels, ','));
  if (!o.plot_svg.empty()) write_file(o.plot_svg, loadgen::render_svg(series, o.plot_title));
  if (!o.plot_png.empty()) write_file(o.plot_png, loadgen::render_png(series, o.plot_title));
}

json read_report(const std::string& path) {
  std::ifstream in(path);
  M3_CHECK(in.good(), "cannot open result file '{}'", path);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  M3_CHECK(j.is_object() && j.contains("runs") && j["runs"].is_array(),
           "'{}': not a bench agentic result (no \"runs\" array)", path);
  for (const json& run : j["runs"]) {
    M3_CHECK(run.contains("interactivity_tok_s_user") && run.contains("throughput") && run.contains("concurrency"),
             "'{}': a run lacks interactivity_tok_s_user, throughput or concurrency", path);
  }
  return j;
}

void run_bench_agentic(const BenchAgenticOptions& o) {
  if (!o.results.empty()) {
    M3_CHECK(!o.plot_svg.empty() || !o.plot_png.empty(), "bench agentic: result files given without --plot/--plot-png");
    std::vector<json> reports;
    for (const std::string& path : o.results) reports.push_back(read_report(path));
    plot(o, reports);
    return;
  }
  std::vector<loadgen::Session> sessions;
  if (!o.generate_traces.empty()) {
    sessions = loadgen::generate_traces(o.generator);
    loadgen::write_traces(o.generate_traces, sessions);
    log(LogLevel::kInfo, "bench agentic: wrote {} synthetic sessions to {}", sessions.size(), o.generate_traces);
    if (o.traces.empty()) return;  // generating only
  }
  M3_CHECK(!o.traces.empty(), "bench agentic: give --traces FILE (or --generate-traces FILE)");
  sessions = loadgen::read_traces(o.traces);
  M3_CHECK(o.endpoint == "chat" || o.endpoint == "completions", "--endpoint: expected chat or completions, got '{}'",
           o.endpoint);

  loadgen::ReplayOptions replay;
  replay.endpoint = loadgen::Endpoint::parse(o.base_url);
  replay.api_key = o.api_key;
  replay.model = o.model.empty() ? served_model(replay.endpoint, o.api_key) : o.model;
  replay.chat = o.endpoint == "chat";
  replay.duration_s = o.duration_s;
  // Neither limit: every session of the corpus once.
  replay.max_replays = o.max_replays > 0 || o.duration_s > 0 ? o.max_replays : static_cast<int>(sessions.size());
  replay.think_time_scale = o.think_time_scale;
  replay.idle_cap_s = o.idle_cap_s;
  M3_CHECK(o.idle_cap_mode == "system" || o.idle_cap_mode == "wait",
           "--idle-cap-mode: expected system or wait, got '{}'", o.idle_cap_mode);
  replay.whole_system_idle_cap = o.idle_cap_mode == "system";
  replay.warmup_requests = o.warmup_requests;
  M3_CHECK(o.trajectory_start_min >= 0 && o.trajectory_start_min <= o.trajectory_start_max &&
               o.trajectory_start_max <= 1,
           "--trajectory-start-min/max-ratio: expected 0 <= min <= max <= 1, got {} and {}", o.trajectory_start_min,
           o.trajectory_start_max);
  replay.trajectory_start_min = o.trajectory_start_min;
  replay.trajectory_start_max = o.trajectory_start_max;
  replay.max_context_length = o.max_context_length;
  replay.request_timeout = std::chrono::seconds(o.request_timeout_s);
  const loadgen::WordPool words = o.tokenizer.empty() ? loadgen::WordPool::builtin() : tokenizer_words(o.tokenizer);
  std::shared_ptr<const text::Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) {
    // With the server's tokenizer the marker's tokens are known: it replaces as many words.
    tokenizer = std::make_shared<const text::Tokenizer>(text::Tokenizer::load(o.tokenizer));
    replay.marker_tokens = [tokenizer](const std::string& marker) {
      return static_cast<int64_t>(tokenizer->encode(marker, false).size());
    };
  }
  const uint64_t nonce = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();

  json report = {{"label", o.label.empty() ? replay.model : o.label},
                 {"base_url", o.base_url},
                 {"model", replay.model},
                 {"endpoint", replay.chat ? "/v1/chat/completions" : "/v1/completions"},
                 {"traces", o.traces},
                 {"num_sessions", sessions.size()},
                 {"num_gpus", o.num_gpus},
                 {"corpus_theoretical_hit_rate", loadgen::corpus_hit_rate(sessions)},
                 {"token_counts", "server usage (stream_options.include_usage)"},
                 {"prompt_words", o.tokenizer.empty() ? "builtin" : "tokenizer:" + o.tokenizer},
                 {"options",
                  {{"duration_s", o.duration_s}, {"max_replays", replay.max_replays},
                   {"think_time_scale", o.think_time_scale}, {"idle_cap_s", o.idle_cap_s},
                   {"idle_cap_mode", o.idle_cap_mode},
                   {"warmup_requests_per_lane", o.warmup_requests},
                   {"trajectory_start_ratio", {o.trajectory_start_min, o.trajectory_start_max}}, {"max_context_length", o.max_context_length}}},
                 {"runs", json::array()}};
  std::vector<int> levels;
  for (const std::string& item : split(o.concurrency, ',')) levels.push_back(std::stoi(item));
  M3_CHECK(!levels.empty(), "--concurrency is empty");
  for (size_t i = 0; i < levels.size(); ++i) {
    replay.concurrency = levels[i];
    replay.run_nonce = nonce + i;
    loadgen::LiveCounters live;
    const loadgen::ServerCounters before = scrape(replay.endpoint, o.api_key);
    loadgen::RunResult run;
    {
      loadgen::ProgressLine progress(live, fmt::format("c={}", levels[i]), !o.no_progress);
      run = loadgen::run_replay(sessions, words, replay, live);
    }
    const loadgen::ServerCounters after = scrape(replay.endpoint, o.api_key);
    // capped_waits counts the per-wait cap's cuts; the whole-system cap reports skipped_idle_s.
    const loadgen::RunSummary summary = loadgen::summarize_run(
        run, before, after, o.num_gpus, replay.whole_system_idle_cap ? -1.0 : o.idle_cap_s);
    print_level(summary);
    json level = loadgen::to_json(summary);
    json records = loadgen::records_to_json(run);
    level["replays"] = std::move(records["replays"]);
    if (o.detailed) level["request_records"] = std::move(records["requests"]);
    report["runs"].push_back(std::move(level));
  }
  const std::string text = report.dump(2);
  if (!o.output.empty()) write_file(o.output, text + "\n");
  if (o.json) std::printf("%s\n", text.c_str());
  if (!o.plot_svg.empty() || !o.plot_png.empty()) plot(o, {report});
}

}  // namespace

void register_bench_agentic(CLI::App& app) {
  auto o = std::make_shared<BenchAgenticOptions>();
  CLI::App* bench = app.get_subcommand("bench");  // created by register_bench_serve
  auto* cmd = bench->add_subcommand(
      "agentic", "AgentX-style replay of agent traces (Weka format) against an OpenAI-compatible server; "
                 "--generate-traces writes a synthetic corpus; RESULT.json files with --plot draw the Pareto frontier");
  cmd->add_option("--traces", o->traces, "Weka-format JSONL trace file (one session per line)");
  cmd->add_option("--generate-traces", o->generate_traces,
                  "write a seeded synthetic corpus to FILE (then replay it only if --traces is given too)");
  auto& g = o->generator;
  cmd->add_option("--num-sessions", g.num_sessions, "generator: sessions")->capture_default_str();
  cmd->add_option("--seed", g.seed, "generator: seed")->capture_default_str();
  cmd->add_option("--gen-median-turns", g.median_turns, "generator: median main-agent requests per session")
      ->capture_default_str();
  cmd->add_option("--gen-system-tokens", g.median_system_tokens, "generator: median system prompt tokens")
      ->capture_default_str();
  cmd->add_option("--gen-tool-tokens", g.median_tool_tokens, "generator: median tool definition tokens")
      ->capture_default_str();
  cmd->add_option("--gen-new-tokens", g.median_new_tokens, "generator: median new input tokens per turn")
      ->capture_default_str();
  cmd->add_option("--gen-output-tokens", g.median_output_tokens, "generator: median output tokens")
      ->capture_default_str();
  cmd->add_option("--gen-think-median", g.think_median_s, "generator: median main-agent think time, seconds")
      ->capture_default_str();
  cmd->add_option("--gen-subagent-probability", g.subagent_probability,
                  "generator: chance per main-agent turn to spawn 1-3 sub-agents")
      ->capture_default_str();
  cmd->add_option("--gen-max-context", g.max_context_tokens, "generator: a session ends before in + out passes this")
      ->capture_default_str();
  cmd->add_option("--base-url", o->base_url, "the server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "sent as Authorization: Bearer");
  cmd->add_option("--model", o->model, "model name to send (default: the first of /v1/models)");
  cmd->add_option("--endpoint", o->endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "live lanes (session trees); a comma-separated list sweeps")
      ->capture_default_str();
  cmd->add_option("--duration", o->duration_s, "seconds per level after which no request starts (0: none)")
      ->capture_default_str();
  cmd->add_option("--max-replays", o->max_replays,
                  "session replays per level (0: unlimited with --duration, else the corpus once)")
      ->capture_default_str();
  cmd->add_option("--think-time-scale", o->think_time_scale, "multiplies recorded think times")->capture_default_str();
  cmd->add_option("--idle-cap-seconds", o->idle_cap_s, "the idle cap, seconds (negative: none)")
      ->capture_default_str();
  cmd->add_option("--idle-cap-mode", o->idle_cap_mode,
                  "system: idle time with no request in flight past the cap is skipped (AgentX); "
                  "wait: no single wait is longer than the cap")
      ->capture_default_str();
  cmd->add_option("--warmup-requests", o->warmup_requests, "per lane: first requests sent but not measured")
      ->capture_default_str();
  cmd->add_option("--trajectory-start-min-ratio", o->trajectory_start_min,
                  "each replay starts at a main-agent request drawn from [min, max] x its requests")
      ->capture_default_str();
  cmd->add_option("--trajectory-start-max-ratio", o->trajectory_start_max, "see --trajectory-start-min-ratio")
      ->capture_default_str();
  cmd->add_option("--max-context-length", o->max_context_length,
                  "skip (and count) requests whose in + out exceed this (0: none)")
      ->capture_default_str();
  cmd->add_option("--num-gpus", o->num_gpus, "GPUs behind the server, for the per-GPU throughputs")
      ->capture_default_str();
  cmd->add_option("--request-timeout", o->request_timeout_s, "seconds a request may go without a byte")
      ->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "model directory whose tokenizer picks the prompt words (one token each: exact counts)");
  cmd->add_option("--label", o->label, "this run's label in its JSON and on plots");
  cmd->add_flag("--json", o->json, "print the results as JSON on stdout");
  cmd->add_option("--output", o->output, "write the results JSON to FILE");
  cmd->add_flag("--detailed", o->detailed, "include every request's record in the JSON");
  cmd->add_flag("--no-progress", o->no_progress, "no progress line (it shows only on a terminal anyway)");
  cmd->add_option("--plot", o->plot_svg, "draw the Pareto frontier as SVG to FILE");
  cmd->add_option("--plot-png", o->plot_png, "draw the Pareto frontier as PNG to FILE");
  cmd->add_option("--plot-title", o->plot_title, "the plot's title")->capture_default_str();
  cmd->add_option("--labels", o->labels, "comma-separated series labels of the RESULT files");
  cmd->add_option("results", o->results, "RESULT.json files of earlier runs: plot them (no replay)");
  cmd->callback([o] { run_bench_agentic(*o); });
}

}  // namespace m3::app
