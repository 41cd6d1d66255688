// m3serve score: for every prompt position after the first, the log-probability of the actual
// next token and the argmax id (teacher forcing over the prompt).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "app/commands.h"
#include "app/model_options.h"
#include "app/prompt_ids.h"
#include "core/error.h"
#include "model/kv_cache.h"

namespace m3::app {
namespace {

struct ScoreOptions {
  ModelOptions model;
  std::string prompt_ids;
  int chunk = 2048;
  bool json = false;
};

void run(const ScoreOptions& o) {
  M3_CHECK(o.chunk > 0, "--chunk-size must be positive");
  LoadedModel lm = load_model(o.model);
  MiniMaxM3& model = *lm.model;
  const int vocab = model.config().vocab_size;
  const std::vector<int32_t> ids = parse_prompt_ids(o.prompt_ids, vocab);
  M3_CHECK(ids.size() >= 2, "score needs at least two prompt ids");
  M3_CHECK(static_cast<int64_t>(ids.size()) <= lm.max_model_len, "prompt ({}) exceeds the max model length {}",
           ids.size(), lm.max_model_len);
  SimpleKvAllocator kv(model.num_kv_blocks(), model.block_size());
  const int seq = kv.add_sequence();
  std::vector<double> logprobs;
  std::vector<int32_t> argmax;
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  // The last position predicts nothing in the prompt: feed ids[0..n-2] only.
  const size_t n = ids.size() - 1;
  for (size_t start = 0; start < n; start += o.chunk) {
    const size_t end = std::min(n, start + o.chunk);
    StepBatch b = kv.build_step({StepChunk{seq, {ids.begin() + start, ids.begin() + end}, true}});
    logits.resize(b.logits_rows.size() * vocab);
    model.forward(b, logits.data());
    for (size_t r = 0; r < end - start; ++r) {
      const float* row = logits.data() + r * vocab;
      int32_t best = 0;
      for (int i = 1; i < vocab; ++i)
        if (row[i] > row[best]) best = i;
      double sum = 0;
      for (int i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - row[best]);
      logprobs.push_back(double(row[ids[start + r + 1]]) - row[best] - std::log(sum));
      argmax.push_back(best);
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "scored %zu positions in %.3f s (%.1f tokens/s)\n", n, s, s > 0 ? n / s : 0.0);
  if (o.json) {
    nlohmann::json j = {{"prompt_ids", ids}, {"prompt_logprobs", logprobs}, {"argmax", argmax}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < logprobs.size(); ++i) std::printf("%zu %d %.6f %d\n", i + 1, ids[i + 1], logprobs[i], argmax[i]);
  }
}

}  // namespace

void register_score(CLI::App& app) {
  auto opts = std::make_shared<ScoreOptions>();
  auto* cmd = app.add_subcommand("score", "log-probabilities of a prompt's tokens");
  add_model_options(*cmd, opts->model);
  cmd->add_option("--prompt-ids", opts->prompt_ids, "comma-separated prompt token ids")->required();
  cmd->add_option("--chunk-size", opts->chunk, "prefill chunk in tokens")->capture_default_str();
  cmd->add_flag("--json", opts->json, "print a JSON object");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace m3::app
