// The engine's sampling plumbing (ModelRunner::forward_sample): a runner that samples "on the
// device" from the SampleBatch alone and hands back only the logits rows asked for must give the
// outputs of host sampling, and the lists of a SampleBatch row must mean what the request's
// SamplingState means.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include <fmt/core.h>

#include "engine/engine_loop.h"
#include "engine/sample_rows.h"
#include "fake_model.h"

namespace m3 {
namespace {

constexpr int kVocab = 97;

// Keeps its logits to itself: samples every SampleRow from the batch's flat lists (rows in
// reverse order, each from a batch holding only its own lists, so rows cannot lean on each other),
// answers the logprob rows (also in reverse order) and copies out only host_rows.
class DeviceSamplingModel final : public ModelRunner {
 public:
  DeviceSamplingModel(int block_size, int64_t num_blocks) : inner_(block_size, num_blocks, kVocab) {}
  int block_size() const override { return inner_.block_size(); }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int vocab_size() const override { return kVocab; }
  int64_t max_position_embeddings() const override { return inner_.max_position_embeddings(); }
  void forward(const StepBatch&, float*) override { FAIL() << "the engine must sample through forward_sample"; }

  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) override {
    device_.assign(batch.logits_rows.size() * kVocab, 0.0f);
    inner_.forward(batch, device_.data());
    for (size_t i = sampling.rows.size(); i-- > 0;) {
      const SampleRow& r = sampling.rows[i];
      const int32_t* ids = sampling.ids.data();
      SampleBatch one;
      one.add(r, ids + r.prompt_begin, r.num_prompt, ids + r.output_begin, sampling.counts.data() + r.output_begin,
              r.num_output, ids + r.masked_begin, r.num_masked, ids + r.bias_begin,
              r.num_bias ? sampling.biases.data() + r.bias_begin : nullptr, r.num_bias);
      sampled_ids[i] = sample_reference(device_.data() + size_t(r.logits_row) * kVocab, kVocab, one.rows[0], one, ws_);
    }
    for (size_t j = sampling.logprobs.size(); j-- > 0;) {
      const LogprobRow& q = sampling.logprobs[j];
      ASSERT_LT(size_t(q.logits_row), batch.logits_rows.size());
      logprob_row_reference(device_.data(), kVocab, q, sampled_ids, logprobs[j]);
    }
    for (size_t i = 0; i < host_rows.size(); ++i)
      std::copy_n(device_.data() + size_t(host_rows[i]) * kVocab, kVocab, host_logits + i * kVocab);
    rows_sampled += sampling.rows.size();
    rows_answered += sampling.logprobs.size();
    rows_copied += host_rows.size();
    rows_computed += batch.logits_rows.size();
  }

  size_t rows_sampled = 0, rows_answered = 0, rows_copied = 0, rows_computed = 0;

 private:
  test::FakeModel inner_;
  std::vector<float> device_;
  SampleWorkspace ws_;
};

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<PositionLogprobs> logprobs;
  std::vector<PositionLogprobs> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
};
using Results = std::map<std::string, Collected>;

Results run(ModelRunner& model, const std::vector<EngineRequest>& requests, int max_num_seqs = 64) {
  EngineConfig config;
  config.max_model_len = 4096;
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = std::max(max_num_seqs, 64);
  EngineLoop loop(model, config);
  Results results;
  for (const EngineRequest& r : requests) {
    loop.add(r,
             [&results, id = r.id](const RequestOutput& out) {
               Collected& c = results[id];
               c.tokens.insert(c.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
               c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
               if (out.prompt_logprobs) c.prompt_logprobs = *out.prompt_logprobs;
               if (out.finished) c.reason = out.finish_reason;
             },
             r.sampling.seed.value_or(0), Clock::now());
  }
  while (loop.has_work()) loop.step();
  EXPECT_EQ(loop.kv().pool().num_used(), 0);
  return results;
}

std::vector<int32_t> prompt_of(int len, uint64_t salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = static_cast<int32_t>(test::mix64(salt * 977 + i) % kVocab);
  return p;
}

// Every sampling parameter, alone and mixed, seeded.
std::vector<EngineRequest> parameter_mix() {
  std::vector<EngineRequest> reqs;
  auto add = [&](const std::function<void(SamplingParams&)>& set) {
    EngineRequest r;
    r.id = fmt::format("r{}", reqs.size());
    r.prompt_token_ids = prompt_of(3 + static_cast<int>(reqs.size() * 7 % 40), reqs.size());
    r.eos_token_ids = {3};
    r.sampling.max_tokens = 12;
    r.sampling.seed = 77 + reqs.size();
    set(r.sampling);
    reqs.push_back(std::move(r));
  };
  add([](SamplingParams& p) { p.temperature = 0.0f; });
  add([](SamplingParams& p) { p.temperature = 0.0f, p.repetition_penalty = 1.7f; });
  add([](SamplingParams& p) { p.temperature = 0.7f; });
  add([](SamplingParams& p) { p.top_k = 5; });
  add([](SamplingParams& p) { p.top_p = 0.6f; });
  add([](SamplingParams& p) { p.min_p = 0.3f; });
  add([](SamplingParams& p) { p.temperature = 1.3f, p.top_k = 20, p.top_p = 0.9f, p.min_p = 0.05f; });
  add([](SamplingParams& p) { p.frequency_penalty = 1.5f, p.presence_penalty = 0.5f; });
  add([](SamplingParams& p) { p.repetition_penalty = 1.3f, p.frequency_penalty = -0.5f, p.top_p = 0.8f; });
  add([](SamplingParams& p) { p.min_tokens = 8, p.stop_token_ids = {5, 9, 11}, p.temperature = 2.0f; });
  add([](SamplingParams& p) { p.min_tokens = 6, p.temperature = 0.0f, p.presence_penalty = 2.0f; });
  add([](SamplingParams& p) { p.logprobs = 3, p.top_k = 7; });
  add([](SamplingParams& p) { p.prompt_logprobs = 2, p.temperature = 0.0f; });
  add([](SamplingParams& p) { p.forced_tokens = {5, 6}, p.logprobs = 1; });
  add([](SamplingParams& p) { p.max_tokens = 0, p.prompt_logprobs = 0; });
  add([](SamplingParams& p) { p.logit_bias_ids = {3, 8, 40}, p.logit_bias_values = {4.0f, -100.0f, 2.5f}; });
  add([](SamplingParams& p) {
    p.temperature = 0.0f, p.repetition_penalty = 1.5f, p.logit_bias_ids = {1, 2}, p.logit_bias_values = {-3.0f, 6.0f};
  });
  return reqs;
}

void expect_same(const Results& a, const Results& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [id, c] : a) {
    const Collected& d = b.at(id);
    EXPECT_EQ(c.tokens, d.tokens) << id;
    EXPECT_EQ(c.reason, d.reason) << id;
    const auto same = [&](const std::vector<PositionLogprobs>& x, const std::vector<PositionLogprobs>& y) {
      ASSERT_EQ(x.size(), y.size()) << id;
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(x[i].token_id, y[i].token_id) << id << " " << i;
        EXPECT_EQ(x[i].logprob, y[i].logprob) << id << " " << i;
        EXPECT_EQ(x[i].rank, y[i].rank) << id << " " << i;
        ASSERT_EQ(x[i].top.size(), y[i].top.size()) << id << " " << i;
        for (size_t t = 0; t < x[i].top.size(); ++t) {
          EXPECT_EQ(x[i].top[t].token_id, y[i].top[t].token_id) << id << " " << i;
          EXPECT_EQ(x[i].top[t].logprob, y[i].top[t].logprob) << id << " " << i;
        }
      }
    };
    same(c.logprobs, d.logprobs);
    same(c.prompt_logprobs, d.prompt_logprobs);
  }
}

TEST(EngineDeviceSampling, SameOutputsAsHostSamplingForEveryParameterMix) {
  const auto reqs = parameter_mix();
  test::FakeModel host(8, 1024, kVocab);  // the default forward_sample: full logits + reference
  DeviceSamplingModel device(8, 1024);
  const Results a = run(host, reqs);
  const Results b = run(device, reqs);
  expect_same(a, b);
  // Small steps: other batch compositions, the same tokens.
  DeviceSamplingModel device_small(8, 1024);
  expect_same(a, run(device_small, reqs, 3));
  ASSERT_GE(a.at("r13").tokens.size(), 2u);
  EXPECT_EQ((std::vector<int32_t>(a.at("r13").tokens.begin(), a.at("r13").tokens.begin() + 2)),
            (std::vector<int32_t>{5, 6}));
}

TEST(EngineDeviceSampling, LogprobsAreAnsweredBesideTheDrawAndForcedTokensAreNotSampled) {
  std::vector<EngineRequest> reqs = parameter_mix();
  size_t generated = 0, forced = 0, logprob_rows = 0, prompt_rows = 0;
  DeviceSamplingModel device(8, 1024);
  const Results out = run(device, reqs);
  for (const EngineRequest& r : reqs) {
    const Collected& c = out.at(r.id);
    generated += c.tokens.size();
    forced += std::min(c.tokens.size(), r.sampling.forced_tokens.size());
    if (r.sampling.logprobs >= 0) logprob_rows += c.tokens.size();
    if (r.sampling.prompt_logprobs >= 0) prompt_rows += r.prompt_token_ids.size() - 1;
  }
  EXPECT_EQ(device.rows_sampled, generated - forced);
  EXPECT_EQ(device.rows_answered, logprob_rows + prompt_rows);
  EXPECT_GT(device.rows_answered, 0u);
  // No logits row leaves the "device": logprobs come back as their answers.
  EXPECT_EQ(device.rows_copied, 0u);

  for (auto& r : reqs) r.sampling.logprobs = r.sampling.prompt_logprobs = -1;
  DeviceSamplingModel quiet(8, 1024);
  run(quiet, reqs);
  EXPECT_EQ(quiet.rows_copied, 0u);
  EXPECT_EQ(quiet.rows_answered, 0u);
  EXPECT_GT(quiet.rows_sampled, 0u);
}

// A SampleBatch row built by add_sample_row samples exactly as HostSampler does from the state.
TEST(SampleBatchRows, ListsMeanWhatTheSamplingStateMeans) {
  std::mt19937_64 rng(5);
  HostSampler sampler;
  SampleWorkspace ws;
  std::uniform_real_distribution<float> logit(-6.0f, 6.0f);
  for (int trial = 0; trial < 300; ++trial) {
    SamplingParams p;
    p.temperature = trial % 5 == 0 ? 0.0f : 0.3f + float(trial % 7) * 0.3f;
    p.top_k = trial % 3 == 0 ? int(rng() % 30) : 0;
    p.top_p = trial % 4 == 0 ? 0.5f + float(trial % 5) * 0.1f : 1.0f;
    p.min_p = trial % 6 == 0 ? 0.1f : 0.0f;
    p.repetition_penalty = trial % 2 ? 1.0f + float(trial % 4) * 0.3f : 1.0f;
    p.frequency_penalty = trial % 3 == 1 ? 0.8f : 0.0f;
    p.presence_penalty = trial % 5 == 2 ? -0.6f : 0.0f;
    p.min_tokens = trial % 4 == 1 ? 5 : 0;
    if (trial % 3 == 2) {
      for (int32_t id = int32_t(rng() % 7); id < kVocab; id += 1 + int32_t(rng() % 9)) {
        p.logit_bias_ids.push_back(id);
        p.logit_bias_values.push_back(logit(rng));
      }
    }
    std::vector<float> logits(kVocab);
    for (float& x : logits) x = logit(rng);
    std::vector<int32_t> prompt_set = prompt_of(20, trial);
    std::sort(prompt_set.begin(), prompt_set.end());
    prompt_set.erase(std::unique(prompt_set.begin(), prompt_set.end()), prompt_set.end());
    std::unordered_map<int32_t, int32_t> counts;
    for (int i = 0; i < int(rng() % 10); ++i) ++counts[int32_t(rng() % kVocab)];
    const std::vector<int32_t> masked = {int32_t(rng() % kVocab), int32_t(rng() % kVocab)};
    SamplingState state;
    state.params = &p;
    state.seed = rng();
    state.output_index = int(rng() % 8);
    state.prompt_token_set = prompt_set;
    state.output_counts = &counts;
    state.min_tokens_masked = masked;

    SampleBatch batch;
    add_sample_row(batch, 0, state);  // a row before it, so that list offsets are not all 0
    add_sample_row(batch, 1, state);
    const int32_t want = sampler.sample(logits, state);
    EXPECT_EQ(sample_reference(logits.data(), kVocab, batch.rows[1], batch, ws), want) << "trial " << trial;
    EXPECT_EQ(batch.rows[1].num_masked, state.output_index < p.min_tokens ? 2 : 0);
    EXPECT_EQ(batch.rows[1].num_prompt, p.repetition_penalty != 1.0f ? int(prompt_set.size()) : 0);
    ASSERT_EQ(batch.rows[1].num_bias, int(p.logit_bias_ids.size()));
    for (int i = 0; i < batch.rows[1].num_bias; ++i) {
      EXPECT_EQ(batch.ids[batch.rows[1].bias_begin + i], p.logit_bias_ids[i]);
      EXPECT_EQ(batch.biases[batch.rows[1].bias_begin + i], p.logit_bias_values[i]);
    }
    EXPECT_EQ(batch.biases.size(), batch.ids.size());
  }
}

}  // namespace
}  // namespace m3
