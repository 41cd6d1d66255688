// m3serve generate: prefill a prompt of token ids, then decode greedily (temperature 0) or by
// sampling, on the CPU backend. Prints the ids (or JSON) on stdout and tokens/s on stderr.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "app/commands.h"
#include "app/model_options.h"
#include "app/prompt_ids.h"
#include "core/error.h"
#include "model/kv_cache.h"

namespace m3::app {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt_ids;
  int max_tokens = 16;
  double temperature = 0.0;
  uint64_t sample_seed = 0;
  int chunk = 2048;
  bool ignore_eos = false;
  bool json = false;
};

int32_t sample(const std::vector<float>& logits, double temperature, std::mt19937_64& rng) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  if (temperature <= 0) return best;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - logits[best]) / temperature);
  double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < p.size(); ++i)
    if ((u -= p[i]) <= 0) return static_cast<int32_t>(i);
  return best;
}

void run(const GenerateOptions& o) {
  M3_CHECK(o.max_tokens >= 0, "--max-tokens must be >= 0");
  M3_CHECK(o.chunk > 0, "--chunk-size must be positive");
  LoadedModel lm = load_model(o.model);
  MiniMaxM3& model = *lm.model;
  const int vocab = model.config().vocab_size;
  const std::vector<int32_t> prompt = parse_prompt_ids(o.prompt_ids, vocab);
  M3_CHECK(static_cast<int64_t>(prompt.size()) + o.max_tokens <= lm.max_model_len,
           "prompt ({}) + --max-tokens ({}) exceed the max model length {}", prompt.size(), o.max_tokens,
           lm.max_model_len);

  SimpleKvAllocator kv(model.num_kv_blocks(), model.block_size());
  const int seq = kv.add_sequence();
  std::vector<float> logits(vocab);
  std::mt19937_64 rng(o.sample_seed);
  using clock = std::chrono::steady_clock;

  const auto t0 = clock::now();
  for (size_t start = 0; start < prompt.size(); start += o.chunk) {
    const size_t end = std::min(prompt.size(), start + o.chunk);
    StepBatch b = kv.build_step({StepChunk{seq, {prompt.begin() + start, prompt.begin() + end}, false}});
    model.forward(b, logits.data());
  }
  const auto t1 = clock::now();
  std::vector<int32_t> out;
  std::string finish = "length";
  const auto& eos = model.config().eos_token_ids;
  for (int i = 0; i < o.max_tokens; ++i) {
    if (i > 0) {
      StepBatch b = kv.build_step({StepChunk{seq, {out.back()}, false}});
      model.forward(b, logits.data());
    }
    out.push_back(sample(logits, o.temperature, rng));
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), out.back()) != eos.end()) {
      finish = "stop";
      break;
    }
  }
  const auto t2 = clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  const size_t decode_steps = out.empty() ? 0 : out.size() - 1;  // the first token comes from the prefill
  const double prefill_tps = prefill_s > 0 ? prompt.size() / prefill_s : 0;
  const double decode_tps = decode_s > 0 && decode_steps > 0 ? decode_steps / decode_s : 0;
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s); decode: %zu steps in %.3f s (%.2f tokens/s)\n",
               prompt.size(), prefill_s, prefill_tps, decode_steps, decode_s, decode_tps);
  if (o.json) {
    nlohmann::json j = {{"prompt_ids", prompt},
                        {"output_ids", out},
                        {"finish_reason", finish},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"decode_tokens_per_s", decode_tps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf(i ? ",%d" : "%d", out[i]);
    std::printf("\n");
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "generate tokens from a prompt of token ids");
  add_model_options(*cmd, opts->model);
  cmd->add_option("--prompt-ids", opts->prompt_ids, "comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", opts->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", opts->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--sample-seed", opts->sample_seed, "seed of temperature sampling");
  cmd->add_option("--chunk-size", opts->chunk, "prefill chunk in tokens")->capture_default_str();
  cmd->add_flag("--ignore-eos", opts->ignore_eos, "keep generating after an end-of-sequence token");
  cmd->add_flag("--json", opts->json, "print a JSON object");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace m3::app
