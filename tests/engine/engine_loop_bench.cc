// How much time the engine itself (schedule, StepBatch, sampling, outputs) spends per step, with
// a model that costs nothing: the engine must never be the bottleneck. Prints a table; asserts
// nothing. Run: build/tests/engine/engine_loop_bench
#include <chrono>
#include <cstdio>
#include <cstring>

#include <fmt/core.h>

#include "engine/engine_loop.h"

namespace m3 {
namespace {

using BenchClock = std::chrono::steady_clock;

// Logits: a single hot token derived from the step's last token, so outputs vary.
class NullModel final : public ModelRunner {
 public:
  NullModel(int block_size, int64_t blocks, int vocab) : block_size_(block_size), blocks_(blocks), vocab_(vocab) {}
  int block_size() const override { return block_size_; }
  int64_t num_kv_blocks() const override { return blocks_; }
  int vocab_size() const override { return vocab_; }
  int64_t max_position_embeddings() const override { return 1 << 21; }
  void forward(const StepBatch& b, float* logits) override {
    const auto t0 = BenchClock::now();
    for (std::size_t r = 0; r < b.logits_rows.size(); ++r) {
      float* row = logits + r * vocab_;
      std::memset(row, 0, sizeof(float) * vocab_);
      row[(b.token_ids[b.logits_rows[r]] * 7919 + 13) % vocab_] = 5.0f;
    }
    forward_s += std::chrono::duration<double>(BenchClock::now() - t0).count();
  }
  double forward_s = 0.0;

 private:
  int block_size_;
  int64_t blocks_;
  int vocab_;
};

struct Case {
  const char* name;
  int num_requests;
  int prompt_len;
  int max_tokens;
  int vocab;
  float temperature;
  float top_p;
  int budget;
  bool prefix_caching;
  int logprobs = -1;  // top logprobs a token (-1: none)
};

void run_case(const Case& c) {
  const int64_t blocks = int64_t(c.num_requests) * ((c.prompt_len + c.max_tokens) / 128 + 2);
  NullModel model(128, blocks, c.vocab);
  EngineConfig config;
  config.max_num_seqs = c.num_requests;
  config.max_num_batched_tokens = c.budget;
  config.max_model_len = 1 << 21;
  config.enable_prefix_caching = c.prefix_caching;
  EngineLoop loop(model, config);
  uint64_t outputs = 0;
  for (int i = 0; i < c.num_requests; ++i) {
    EngineRequest r;
    r.id = fmt::format("r{}", i);
    r.prompt_token_ids.resize(c.prompt_len);
    for (int t = 0; t < c.prompt_len; ++t) r.prompt_token_ids[t] = (t * 31 + i * 17) % c.vocab;
    r.sampling.max_tokens = c.max_tokens;
    r.sampling.temperature = c.temperature;
    r.sampling.top_p = c.top_p;
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = c.logprobs;
    loop.add(std::move(r), [&outputs](const RequestOutput& out) { outputs += out.new_token_ids.size(); }, i,
             Clock::now());
  }
  int steps = 0;
  const auto t0 = BenchClock::now();
  while (loop.has_work()) {
    loop.step();
    ++steps;
  }
  const double total_s = std::chrono::duration<double>(BenchClock::now() - t0).count();
  const double engine_s = total_s - model.forward_s;
  std::printf("%-34s %6d %8d %7llu %9.3f %9.3f %10.1f %12.0f\n", c.name, steps, c.num_requests * c.prompt_len,
              static_cast<unsigned long long>(outputs), total_s, model.forward_s, 1e6 * engine_s / steps,
              outputs / engine_s);
}

}  // namespace
}  // namespace m3

int main() {
  using m3::Case;
  std::printf("%-34s %6s %8s %7s %9s %9s %10s %12s\n", "case", "steps", "prompt", "outputs", "total_s", "model_s",
              "engine_us/step", "out_tok/s(engine)");
  const Case cases[] = {
      {"64 x decode, vocab 8K, greedy", 64, 512, 256, 8192, 0.0f, 1.0f, 8192, true},
      {"64 x decode, vocab 200K, greedy", 64, 512, 64, 200064, 0.0f, 1.0f, 8192, true},
      {"64 x decode, vocab 200K, logprobs 5", 64, 512, 64, 200064, 0.0f, 1.0f, 8192, true, 5},
      {"64 x decode, vocab 200K, top_p .9", 64, 512, 32, 200064, 0.8f, 0.9f, 8192, true},
      {"256 x decode, vocab 8K, greedy", 256, 256, 128, 8192, 0.0f, 1.0f, 8192, true},
      {"1 x 1M-token prompt, chunks 8K", 1, 1 << 20, 4, 8192, 0.0f, 1.0f, 8192, true},
      {"8 x 128K prompt, chunks 8K, no cache", 8, 1 << 17, 16, 8192, 0.0f, 1.0f, 8192, false},
  };
  for (const Case& c : cases) m3::run_case(c);
  return 0;
}
