// m3serve bench throughput: offline throughput through the engine core, as vLLM's
// `bench throughput` on its random dataset: --num-prompts requests of --input-len random token
// ids, each generating exactly --output-len tokens (eos ignored, greedy), all submitted at once;
// reports requests/s, total tokens/s and output tokens/s over the wall time from the first
// submission to the last completion. Prefix caching is off by default (random prompts share
// nothing; vLLM's number does not depend on it either).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "app/offline_requests.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "model/config.h"

namespace m3::app {
namespace {

struct BenchThroughputOptions {
  ModelOptions model;
  EngineOptions engine{128, 8192, false};
  int num_prompts = 64;
  int input_len = 512;
  int output_len = 128;
  uint64_t seed = 0;
  bool json = false;
};

void run(BenchThroughputOptions o) {
  locate_model(o.model);
  M3_CHECK(o.num_prompts >= 1, "--num-prompts must be >= 1");
  M3_CHECK(o.input_len >= 1 && o.output_len >= 1, "--input-len and --output-len must be >= 1");
  const int64_t per_seq = int64_t(o.input_len) + o.output_len;
  if (o.model.max_model_len == 0) o.model.max_model_len = per_seq;
  // Every request can run at once (up to max_num_seqs): no preemption by default.
  LoadedModel loaded =
      load_model(o.model, o.engine, KvDemand{std::min(o.num_prompts, o.engine.max_num_seqs), per_seq});
  if (loaded.follower()) return follow_node_zero(loaded, o.model, o.engine);
  std::unique_ptr<EngineCore> core = make_engine(loaded, o.model, o.engine);
  EngineCore& engine = *core;

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(3, engine.vocab_size() - 1);
  std::vector<EngineRequest> requests(o.num_prompts);
  for (int i = 0; i < o.num_prompts; ++i) {
    EngineRequest& r = requests[i];
    r.id = fmt::format("throughput-{}", i);
    r.prompt_token_ids.resize(o.input_len);
    for (int32_t& t : r.prompt_token_ids) t = token(rng);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = o.output_len;
    r.sampling.ignore_eos = true;
  }

  const EngineStats before = engine.stats();
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<CompletedRequest> done = run_to_completion(engine, std::move(requests));
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine.shutdown(true);
  const EngineStats after = engine.stats();
  uint64_t output_tokens = 0;
  int failed = 0;
  for (const CompletedRequest& r : done) {
    output_tokens += r.output_ids.size();
    failed += r.finish_reason != FinishReason::kLength && r.finish_reason != FinishReason::kStop;
  }

  const uint64_t input_tokens = uint64_t(o.num_prompts) * o.input_len;
  nlohmann::json out = {{"model", o.model.model_dir},
                        {"num_layers", loaded.model().config().num_layers},
                        {"backend", std::string(loaded.ranks.front().backend->name())},
                        {"num_requests", o.num_prompts},
                        {"input_len", o.input_len},
                        {"output_len", o.output_len},
                        {"elapsed_time", wall_s},
                        {"total_input_tokens", input_tokens},
                        {"total_output_tokens", output_tokens},
                        {"total_num_tokens", input_tokens + output_tokens},
                        {"requests_per_second", o.num_prompts / wall_s},
                        {"tokens_per_second", double(input_tokens + output_tokens) / wall_s},
                        {"output_tokens_per_second", double(output_tokens) / wall_s},
                        {"num_steps", after.num_steps - before.num_steps},
                        {"num_preemptions", after.num_preemptions - before.num_preemptions},
                        {"failed", failed}};
  // Speculative decoding: this run's verification steps, drafts and kept drafts (vLLM's counters).
  const uint64_t spec_steps = after.spec_num_drafts - before.spec_num_drafts;
  if (!o.engine.speculative_config.empty()) {
    const uint64_t kept = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens;
    out["spec_decode"] = {{"num_drafts", spec_steps},
                          {"num_draft_tokens", after.spec_num_draft_tokens - before.spec_num_draft_tokens},
                          {"num_accepted_tokens", kept},
                          {"mean_acceptance_length", spec_steps ? nlohmann::json(1.0 + double(kept) / spec_steps)
                                                                : nlohmann::json(nullptr)}};
    if (after.spec_adaptive_verification)
      out["spec_decode"]["num_unverified_draft_tokens"] =
          after.spec_num_unverified_draft_tokens - before.spec_num_unverified_draft_tokens;
  }
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n",
              out["requests_per_second"].get<double>(), out["tokens_per_second"].get<double>(),
              out["output_tokens_per_second"].get<double>());
  std::printf("Total num prompt tokens:  %llu\nTotal num output tokens:  %llu\n",
              static_cast<unsigned long long>(input_tokens), static_cast<unsigned long long>(output_tokens));
  std::printf("Elapsed %.2f s over %llu engine steps, %llu preemptions%s\n", wall_s,
              static_cast<unsigned long long>(after.num_steps - before.num_steps),
              static_cast<unsigned long long>(after.num_preemptions - before.num_preemptions),
              failed ? fmt::format("; {} requests did not finish normally", failed).c_str()
                                  : "");
  if (out.contains("spec_decode")) {
    const nlohmann::json& sd = out["spec_decode"];
    if (spec_steps == 0) {
      std::printf("Speculative decoding: no step verified drafts (the drafter proposed none)\n");
    } else {
      std::printf("Speculative decoding: %llu verification steps, %llu of %llu drafts kept, mean acceptance length %.3f\n",
                  static_cast<unsigned long long>(spec_steps), sd["num_accepted_tokens"].get<unsigned long long>(),
                  sd["num_draft_tokens"].get<unsigned long long>(), sd["mean_acceptance_length"].get<double>());
    }
  }
}

}  // namespace

void register_bench_throughput(CLI::App& app) {
  CLI::App* bench = app.get_subcommand("bench");  // created by register_bench_serve
  auto* cmd = bench->add_subcommand(
      "throughput", "offline throughput through the engine: N random prompts submitted at once (requests/s, "
                    "total and output tokens/s), as vLLM's bench throughput");
  auto o = std::make_shared<BenchThroughputOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--num-prompts", o->num_prompts, "requests")->capture_default_str();
  cmd->add_option("--input-len", o->input_len, "prompt tokens per request (random ids)")->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "output tokens per request (eos ignored)")->capture_default_str();
  add_engine_options(*cmd, o->engine);  // defaults: 128 sequences, 8192 tokens, no prefix caching
  cmd->add_option("--bench-seed", o->seed, "seed of the random prompts")->capture_default_str();
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace m3::app
