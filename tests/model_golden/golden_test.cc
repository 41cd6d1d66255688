// Golden tests of the CPU forward pass against the Hugging Face reference (transformers 5.17,
// fp32 eager), on every committed checkpoint (tools/make_golden_models.py,
// tools/make_release_checkpoint.py, tools/make_bundled_model.py), plus the step-batch
// invariances: decode == prefill, chunked == one-shot, batched == alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tests/model_golden/golden_util.h"

namespace m3::test {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string name;
  fs::path model_dir;
  fs::path golden_dir;
  std::string key;  // "" or the sub-object of golden.json ("fp32" for the bundled model)
};

const fs::path kData = "tests/model_golden/data";

std::vector<Case> cases() {
  return {
      {"tiny_mixed", kData / "tiny-mixed", kData / "tiny-mixed", ""},
      {"tiny_sparse_local2", kData / "tiny-sparse-local2", kData / "tiny-sparse-local2", ""},
      // The VL wrapper as save_pretrained writes it (release-style names, dense layers under
      // block_sparse_moe.{gate,up,down}_proj).
      {"tiny_vl", kData / "tiny-vl", kData / "tiny-vl", ""},
      {"release_mxfp8_nvfp4", kData / "release-mxfp8-nvfp4", kData / "release-mxfp8-nvfp4", ""},
      {"release_modelopt_nvfp4", kData / "release-modelopt-nvfp4", kData / "release-modelopt-nvfp4", ""},
      {"bundled_tiny", "models/minimax-m3-tiny", kData / "bundled-tiny", "fp32"},
  };
}

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int> logit_rows;
  std::vector<float> logits;  // [logit_rows, vocab]
  std::vector<int32_t> greedy;
  std::vector<double> margins;
};

class Golden : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    loaded_ = load_model(c.model_dir);
    vocab_ = loaded_.model->config().vocab_size;
    nlohmann::json g = read_json(c.golden_dir / "golden.json");
    if (!c.key.empty()) g = g.at(c.key);
    for (const auto& p : g.at("prompts")) {
      Prompt pr;
      pr.ids = p.at("ids").get<std::vector<int32_t>>();
      pr.logit_rows = p.at("logit_rows").get<std::vector<int>>();
      pr.logits = read_f32(c.golden_dir / p.at("logits_file").get<std::string>(),
                           pr.logit_rows.size() * vocab_);
      pr.greedy = p.at("greedy").get<std::vector<int32_t>>();
      pr.margins = p.at("greedy_margins").get<std::vector<double>>();
      prompts_.push_back(std::move(pr));
    }
  }
  MiniMaxM3& model() { return *loaded_.model; }

  LoadedModel loaded_;
  int vocab_ = 0;
  std::vector<Prompt> prompts_;
};

TEST_P(Golden, PrefillLogitsMatchReference) {
  double worst = 0;
  for (const Prompt& p : prompts_) {
    const std::vector<float> ours = prefill_logits(model(), p.ids, 1 << 20);
    for (size_t r = 0; r < p.logit_rows.size(); ++r) {
      const double err = row_rel_error(ours.data() + size_t(p.logit_rows[r]) * vocab_,
                                       p.logits.data() + r * vocab_, vocab_);
      worst = std::max(worst, err);
      ASSERT_LE(err, 1e-4) << "prompt of " << p.ids.size() << " tokens, position " << p.logit_rows[r];
    }
  }
  std::printf("[%s] fp32 logits vs reference: max relative error %.3g\n", GetParam().name.c_str(), worst);
}

TEST_P(Golden, GreedyMatchesReferenceWhereMarginIsClear) {
  for (const Prompt& p : prompts_) {
    const std::vector<int32_t> ours = greedy(model(), p.ids, static_cast<int>(p.greedy.size()));
    size_t checked = 0;
    for (size_t i = 0; i < p.greedy.size(); ++i) {
      if (p.margins[i] <= 1e-3) break;  // a near tie: the continuations may part from here on
      ASSERT_EQ(ours[i], p.greedy[i]) << "greedy step " << i << " of a " << p.ids.size() << "-token prompt";
      ++checked;
    }
    EXPECT_GT(checked, 0u);
  }
}

TEST_P(Golden, DecodeStepByStepEqualsPrefill) {
  const Prompt& p = *std::min_element(prompts_.begin(), prompts_.end(),
                                      [](const Prompt& a, const Prompt& b) { return a.ids.size() < b.ids.size(); });
  const std::vector<float> one_shot = prefill_logits(model(), p.ids, 1 << 20);
  const std::vector<float> stepwise = prefill_logits(model(), p.ids, 1);
  for (size_t r = 0; r < p.ids.size(); ++r)
    ASSERT_LE(row_rel_error(stepwise.data() + r * vocab_, one_shot.data() + r * vocab_, vocab_), 1e-5)
        << "position " << r;
}

TEST_P(Golden, ChunkedPrefillEqualsOneShot) {
  const Prompt& p = *std::max_element(prompts_.begin(), prompts_.end(),
                                      [](const Prompt& a, const Prompt& b) { return a.ids.size() < b.ids.size(); });
  const std::vector<float> one_shot = prefill_logits(model(), p.ids, 1 << 20);
  for (int chunk : {37, 64}) {
    const std::vector<float> chunked = prefill_logits(model(), p.ids, chunk);
    for (size_t r = 0; r < p.ids.size(); ++r)
      ASSERT_LE(row_rel_error(chunked.data() + r * vocab_, one_shot.data() + r * vocab_, vocab_), 1e-5)
          << "chunk " << chunk << ", position " << r;
  }
}

TEST_P(Golden, BatchedEqualsAlone) {
  // Three sequences (prompt + one decode token each) fed in interleaved steps that mix prefill
  // chunks and decode tokens, with pages interleaved across sequences in the pool.
  std::vector<std::vector<int32_t>> seqs;
  for (const Prompt& p : prompts_) seqs.push_back(p.ids);
  while (seqs.size() < 3) seqs.push_back({seqs[0].begin(), seqs[0].begin() + 40 + 23 * seqs.size()});
  seqs.resize(3);
  for (auto& s : seqs) s.push_back(5);
  SimpleKvAllocator kv(model().num_kv_blocks(), model().block_size());
  std::vector<int> handle;
  std::vector<std::vector<float>> got(3);
  std::vector<size_t> done(3, 0);
  for (int i = 0; i < 3; ++i) {
    handle.push_back(kv.add_sequence());
    got[i].resize(seqs[i].size() * vocab_);
  }
  auto run = [&](std::vector<std::pair<int, size_t>> plan) {  // (sequence, tokens to add)
    std::vector<StepChunk> chunks;
    for (auto [s, n] : plan)
      chunks.push_back({handle[s], {seqs[s].begin() + done[s], seqs[s].begin() + done[s] + n}, true});
    StepBatch b = kv.build_step(chunks);
    std::vector<float> logits(b.logits_rows.size() * vocab_);
    model().forward(b, logits.data());
    size_t row = 0;
    for (auto [s, n] : plan)
      for (size_t j = 0; j < n; ++j, ++row)
        std::copy_n(logits.data() + row * vocab_, vocab_, got[s].data() + (done[s] + j) * vocab_);
    for (auto [s, n] : plan) done[s] += n;
  };
  const size_t a = seqs[0].size(), b = seqs[1].size(), c = seqs[2].size();
  run({{0, 40}, {1, 30}});
  run({{1, b - 31}, {0, a - 41}, {2, 17}});
  run({{0, 1}, {2, c - 18}, {1, 1}});
  run({{2, 1}});
  for (int s = 0; s < 3; ++s) {
    const std::vector<float> alone = prefill_logits(model(), seqs[s], 1 << 20);
    for (size_t r = 0; r < seqs[s].size(); ++r)
      ASSERT_LE(row_rel_error(got[s].data() + r * vocab_, alone.data() + r * vocab_, vocab_), 1e-5)
          << "sequence " << s << ", position " << r;
  }
}

// Quantized KV caches (K, V and index-K in the same dtype) against the fp32 cache on the longest
// prompt: the errors are printed for the report. These random tiny models amplify a perturbation
// through discrete decisions (MoE routing flips, block-selection flips with 8-token blocks), so a
// few positions change completely even with bf16 KV; the checks are therefore statistical: mean
// relative error and argmax agreement within bounds that a correct cache meets with margin, while a
// wrong encoding or decoding (garbage K/V) gives agreement near 1/vocab and errors near 1; and the
// error must grow with coarser formats (bf16: 8 significant bits, E4M3: 4, NVFP4: 2 plus a group
// scale, with E4M3 queries and probabilities on the Q8KV4 path).
TEST_P(Golden, QuantizedKvErrorIsBounded) {
  const Case& c = GetParam();
  const Prompt& p = *std::max_element(prompts_.begin(), prompts_.end(),
                                      [](const Prompt& a, const Prompt& b) { return a.ids.size() < b.ids.size(); });
  const std::vector<float> ref = prefill_logits(model(), p.ids, 1 << 20);
  struct Mode {
    KvDType dtype;
    double mean_bound, min_agree;
  };
  double previous_mean = 0;
  for (Mode mode : {Mode{KvDType::kBF16, 0.1, 0.85}, Mode{KvDType::kFP8, 0.3, 0.6},
                    Mode{KvDType::kNVFP4, 0.5, 0.45}}) {
    LoadedModel q = load_model(c.model_dir, DType::kF32, mode.dtype, mode.dtype);
    const std::vector<float> got = prefill_logits(*q.model, p.ids, 1 << 20);
    std::vector<double> errs;
    int agree = 0;
    for (size_t r = 0; r < p.ids.size(); ++r) {
      errs.push_back(row_rel_error(got.data() + r * vocab_, ref.data() + r * vocab_, vocab_));
      agree += argmax(got.data() + r * vocab_, vocab_) == argmax(ref.data() + r * vocab_, vocab_);
    }
    double mean = 0;
    for (double e : errs) mean += e;
    mean /= errs.size();
    std::sort(errs.begin(), errs.end());
    const double agree_frac = double(agree) / p.ids.size();
    std::printf("[%s] KV %s vs f32 over %zu positions: relative logit error median %.4f mean %.4f max %.4f, "
                "argmax agree %.1f%%\n",
                c.name.c_str(), std::string(kv_dtype_name(mode.dtype)).c_str(), p.ids.size(),
                errs[errs.size() / 2], mean, errs.back(), 100.0 * agree_frac);
    EXPECT_LE(mean, mode.mean_bound) << kv_dtype_name(mode.dtype);
    EXPECT_GE(agree_frac, mode.min_agree) << kv_dtype_name(mode.dtype);
    EXPECT_GE(mean, previous_mean) << kv_dtype_name(mode.dtype) << " is more accurate than a finer format";
    previous_mean = mean;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Golden, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace m3::test
