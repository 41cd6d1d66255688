// m3serve generate: one prompt of token ids through the engine (the serving path: chunked prefill,
// sampling on the backend with the request's parameters), greedy by default. Prints the ids (or
// JSON) on stdout and the prefill / decode speeds on stderr.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "app/offline_requests.h"
#include "app/prompt_ids.h"
#include "core/error.h"

namespace m3::app {
namespace {

struct GenerateOptions {
  ModelOptions model;
  EngineOptions engine;
  std::string prompt_ids;
  SamplingParams sampling;
  std::optional<uint64_t> sample_seed;
  bool json = false;
};

void run(GenerateOptions o) {
  o.sampling.seed = o.sample_seed;
  locate_model(o.model);
  LoadedModel loaded = load_model(o.model, o.engine, KvDemand{});
  if (loaded.follower()) return follow_node_zero(loaded, o.model, o.engine);
  std::unique_ptr<EngineCore> engine = make_engine(loaded, o.model, o.engine);
  EngineRequest request;
  request.id = "generate";
  request.prompt_token_ids = parse_prompt_ids(o.prompt_ids, engine->vocab_size());
  request.sampling = o.sampling;
  request.eos_token_ids = loaded.model().config().eos_token_ids;
  const std::vector<int32_t> prompt = request.prompt_token_ids;
  std::vector<EngineRequest> requests;
  requests.push_back(std::move(request));
  const CompletedRequest out = run_to_completion(*engine, std::move(requests)).front();
  const EngineStats stats = engine->stats();
  engine->shutdown(true);
  M3_CHECK(out.finish_reason != FinishReason::kError, "generate failed: {}", out.error);

  // The first output token comes with the prefill (time to first token); the rest are decode steps.
  const double prefill_s = out.timings.ttft_s - out.timings.queue_s;
  const double decode_s = out.timings.e2e_s - out.timings.ttft_s;
  const size_t decode_steps = out.output_ids.empty() ? 0 : out.output_ids.size() - 1;
  const double prefill_tps = prefill_s > 0 ? prompt.size() / prefill_s : 0;
  const double decode_tps = decode_s > 0 && decode_steps > 0 ? decode_steps / decode_s : 0;
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s); decode: %zu tokens in %.3f s (%.2f tokens/s)\n",
               prompt.size(), prefill_s, prefill_tps, decode_steps, decode_s, decode_tps);
  nlohmann::json spec;
  if (!o.engine.speculative_config.empty()) {
    // vLLM's mean acceptance length counts the target's own token: 1 + kept / verification steps.
    spec = {{"num_drafts", stats.spec_num_drafts},
            {"num_draft_tokens", stats.spec_num_draft_tokens},
            {"num_accepted_tokens", stats.spec_num_accepted_tokens},
            {"accepted_per_pos", stats.spec_accepted_per_pos},
            {"mean_acceptance_length", nullptr}};
    if (stats.spec_adaptive_verification) spec["num_unverified_draft_tokens"] = stats.spec_num_unverified_draft_tokens;
    if (stats.spec_num_drafts == 0) {
      std::fprintf(stderr, "speculative: no step verified drafts (the drafter proposed none)\n");
    } else {
      const double length = 1.0 + static_cast<double>(stats.spec_num_accepted_tokens) / stats.spec_num_drafts;
      spec["mean_acceptance_length"] = length;
      std::fprintf(stderr, "speculative: %llu steps verified %llu drafts, kept %llu; mean acceptance length %.3f%s\n",
                   static_cast<unsigned long long>(stats.spec_num_drafts),
                   static_cast<unsigned long long>(stats.spec_num_draft_tokens),
                   static_cast<unsigned long long>(stats.spec_num_accepted_tokens), length,
                   stats.spec_adaptive_verification
                       ? fmt::format("; {} drafts left out by adaptive verification",
                                     stats.spec_num_unverified_draft_tokens)
                             .c_str()
                       : "");
    }
  }
  if (o.json) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"output_ids", out.output_ids},
                        {"finish_reason", std::string(finish_reason_name(out.finish_reason))},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"decode_tokens_per_s", decode_tps}};
    if (!spec.is_null()) j["spec_decode"] = spec;
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.output_ids.size(); ++i) std::printf(i ? ",%d" : "%d", out.output_ids[i]);
    std::printf("\n");
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  GenerateOptions& o = *opts;
  o.sampling.temperature = 0.0f;  // greedy unless asked
  auto* cmd = app.add_subcommand("generate", "generate tokens from a prompt of token ids (through the engine)");
  add_model_options(*cmd, o.model);
  add_engine_options(*cmd, o.engine);
  cmd->add_option("--prompt-ids", o.prompt_ids, "comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", o.sampling.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o.sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", o.sampling.top_p, "nucleus sampling mass (1 disables)")->capture_default_str();
  cmd->add_option("--top-k", o.sampling.top_k, "keep the k most likely tokens (0 disables)")->capture_default_str();
  cmd->add_option("--min-p", o.sampling.min_p, "keep tokens with prob >= min_p * max prob")->capture_default_str();
  cmd->add_option("--repetition-penalty", o.sampling.repetition_penalty, "as vLLM (1 disables)")
      ->capture_default_str();
  cmd->add_option("--sample-seed", o.sample_seed, "seed of this request's sampling draws (default: drawn from --seed's generator)");
  cmd->add_flag("--ignore-eos", o.sampling.ignore_eos, "keep generating after an end-of-sequence token");
  cmd->add_flag("--json", o.json, "print a JSON object");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace m3::app
