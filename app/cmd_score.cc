// m3serve score: for every prompt position after the first, the log-probability of the actual
// next token and the argmax id (teacher forcing over the prompt), as the engine computes prompt
// logprobs for the server (prompt_logprobs with k = 1; log_softmax of the raw logits).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "app/offline_requests.h"
#include "app/prompt_ids.h"
#include "core/error.h"

namespace m3::app {
namespace {

struct ScoreOptions {
  ModelOptions model;
  EngineOptions engine;
  std::string prompt_ids;
  bool json = false;
};

void run(ScoreOptions o) {
  locate_model(o.model);
  LoadedModel loaded = load_model(o.model, o.engine, KvDemand{});
  if (loaded.follower()) return follow_node_zero(loaded, o.model, o.engine);
  std::unique_ptr<EngineCore> engine = make_engine(loaded, o.model, o.engine);
  EngineRequest request;
  request.id = "score";
  request.prompt_token_ids = parse_prompt_ids(o.prompt_ids, engine->vocab_size());
  M3_CHECK(request.prompt_token_ids.size() >= 2, "score needs at least two prompt ids");
  request.sampling.max_tokens = 0;  // the prompt only
  request.sampling.prompt_logprobs = 1;
  const std::vector<int32_t> ids = request.prompt_token_ids;
  std::vector<EngineRequest> requests;
  requests.push_back(std::move(request));
  const auto t0 = std::chrono::steady_clock::now();
  const CompletedRequest out = run_to_completion(*engine, std::move(requests)).front();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine->shutdown(true);
  M3_CHECK(out.finish_reason != FinishReason::kError, "score failed: {}", out.error);
  M3_CHECK(out.prompt_logprobs && out.prompt_logprobs->size() == ids.size() - 1,
           "score: the engine returned {} prompt logprobs for {} ids",
           out.prompt_logprobs ? out.prompt_logprobs->size() : 0, ids.size());

  std::vector<double> logprobs;
  std::vector<int32_t> argmax;
  for (const PositionLogprobs& p : *out.prompt_logprobs) {
    logprobs.push_back(p.logprob);
    argmax.push_back(p.top.front().token_id);
  }
  const size_t n = logprobs.size();
  std::fprintf(stderr, "scored %zu positions in %.3f s (%.1f tokens/s)\n", n, s, s > 0 ? n / s : 0.0);
  if (o.json) {
    nlohmann::json j = {{"prompt_ids", ids}, {"prompt_logprobs", logprobs}, {"argmax", argmax}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < n; ++i) std::printf("%zu %d %.6f %d\n", i + 1, ids[i + 1], logprobs[i], argmax[i]);
  }
}

}  // namespace

void register_score(CLI::App& app) {
  auto opts = std::make_shared<ScoreOptions>();
  auto* cmd = app.add_subcommand("score", "log-probabilities of a prompt's tokens (through the engine)");
  add_model_options(*cmd, opts->model);
  add_engine_options(*cmd, opts->engine);
  cmd->add_option("--prompt-ids", opts->prompt_ids, "comma-separated prompt token ids")->required();
  cmd->add_flag("--json", opts->json, "print a JSON object");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace m3::app
