// MiniMaxM3::forward and the replay hook (ops/backend.h run_replayable), on the CPU reference:
// uniform decode steps (one token and one logits row per sequence) are offered for replay with a
// key of their shape, other steps are not, the key changes when the model's activations move,
// and the logits are those of the plain CPU backend, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "tests/support/simple_kv_allocator.h"
#include "model/minimax_m3.h"
#include "model/weights.h"

namespace m3 {
namespace {

// Forwards every op to the CPU backend and records the replay calls (running each body once, as
// the default does).
class RecordingBackend final : public Backend {
 public:
  std::vector<ReplayKey> keys;

  std::string_view name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  void configure(const BackendConfig& c) override { inner_->configure(c); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  DType activation_storage_dtype() const override { return inner_->activation_storage_dtype(); }
  Tensor alloc(Shape shape, DType dtype) override { return inner_->alloc(std::move(shape), dtype); }
  Tensor to_device(const Tensor& host, std::string_view what) override { return inner_->to_device(host, what); }
  void copy_to_host_f32(const Tensor& src, float* dst) override { inner_->copy_to_host_f32(src, dst); }
  void plan(const StepBatch& b) override { inner_->plan(b); }
  StepView planned_step() const override { return inner_->planned_step(); }
  void run_replayable(const ReplayKey& key, const std::function<void()>& body) override {
    keys.push_back(key);
    body();
  }
  void embed(const Tensor& table, int64_t first_id, Tensor out) override { inner_->embed(table, first_id, out); }
  void concat_column_parts(const Tensor& parts, int num_parts, Tensor out) override {
    inner_->concat_column_parts(parts, num_parts, out);
  }
  void gather_logits_rows(const Tensor& x, Tensor out) override { inner_->gather_logits_rows(x, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) override { inner_->rms_norm(x, w, eps, out); }
  void linear(const Tensor& x, const LinearWeight& w, Tensor out) override { inner_->linear(x, w, out); }
  void head_norm_rope(Tensor x, int heads, int dim, const Tensor& norm, float eps, int rope) override {
    inner_->head_norm_rope(x, heads, dim, norm, eps, rope);
  }
  void kv_insert(const KvLayerView& cache, const Tensor& k, const Tensor& v, const Tensor& ik) override {
    inner_->kv_insert(cache, k, v, ik);
  }
  void attention_input(const KvLayerView& cache, const AttentionInputs& in) override {
    inner_->attention_input(cache, in);
  }
  void indexer_topk(const KvLayerView& cache, const Tensor& iq, const IndexerParams& p, Tensor sel) override {
    inner_->indexer_topk(cache, iq, p, sel);
  }
  void indexer_topk_candidates(const KvLayerView& cache, const Tensor& iq, int parts, const IndexerParams& p, int cp,
                               int rank, Tensor cand) override {
    inner_->indexer_topk_candidates(cache, iq, parts, p, cp, rank, cand);
  }
  void merge_topk_candidates(const Tensor& g, int cp, int parts, int part, const IndexerParams& p, Tensor sel) override {
    inner_->merge_topk_candidates(g, cp, parts, part, p, sel);
  }
  void paged_attention(const KvLayerView& cache, const Tensor& q, int hq, const Tensor& sel, int topk, float scale,
                       Tensor out) override {
    inner_->paged_attention(cache, q, hq, sel, topk, scale, out);
  }
  void draft_block_attention(const KvLayerView& cache, const Tensor& q, int hq, const Tensor& k, const Tensor& v,
                             int block_len, int window, float scale, Tensor out) override {
    inner_->draft_block_attention(cache, q, hq, k, v, block_len, window, scale, out);
  }
  void markov_drafts(const Tensor& logits, const Tensor& normed, const MarkovHeadWeights& head, int block_len,
                     int32_t* ids, float* confidence) override {
    inner_->markov_drafts(logits, normed, head, block_len, ids, confidence);
  }
  void swiglu_mlp(const Tensor& x, const LinearWeight& g, const LinearWeight& u, const LinearWeight& d, float a,
                  float l, Tensor out) override {
    inner_->swiglu_mlp(x, g, u, d, a, l, out);
  }
  void moe(const Tensor& x, const MlpWeights& w, const MoeParams& p, Tensor out) override { inner_->moe(x, w, p, out); }
  void add_inplace(Tensor x, const Tensor& y) override { inner_->add_inplace(x, y); }

 private:
  std::unique_ptr<Backend> inner_ = make_cpu_backend();
};

constexpr const char* kModel = "tests/model_golden/data/tiny-mixed";

struct Models {
  ModelConfig config = load_model_config(kModel);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  RecordingBackend recording;
  std::unique_ptr<MiniMaxM3> plain, recorded;
  Models() {
    const ModelWeights weights = load_weights(config, kModel);
    ModelRuntimeOptions o;
    o.activation_dtype = DType::kBF16;
    o.kv_dtype = KvDType::kBF16;
    o.index_dtype = KvDType::kBF16;
    o.num_kv_blocks = 256;
    plain = std::make_unique<MiniMaxM3>(config, weights, *cpu, o);
    recorded = std::make_unique<MiniMaxM3>(config, weights, recording, o);
  }
};

// Runs a step on both models; the logits must be bitwise equal.
void step_both(Models& m, const StepBatch& b) {
  const size_t n = b.logits_rows.size() * size_t(m.config.vocab_size);
  std::vector<float> a(n), r(n);
  m.plain->forward(b, a.data());
  m.recorded->forward(b, r.data());
  ASSERT_EQ(std::memcmp(a.data(), r.data(), n * sizeof(float)), 0);
}

std::vector<int32_t> prompt(int len, int salt) {
  std::vector<int32_t> p(len);
  for (int i = 0; i < len; ++i) p[i] = (i * 31 + salt) % 256;
  return p;
}

TEST(ModelReplay, OnlyUniformStepsAreOffered) {
  Models m;
  SimpleKvAllocator alloc(256, m.config.index_block_size);
  const int a = alloc.add_sequence(), b = alloc.add_sequence(), c = alloc.add_sequence();
  // Prefill (several tokens per sequence): not offered.
  step_both(m, alloc.build_step({StepChunk{a, prompt(20, 1), false}, StepChunk{b, prompt(13, 2), false}}));
  EXPECT_TRUE(m.recording.keys.empty());
  // Scoring rows (all logits of a chunk) of more than 8 tokens: not offered.
  step_both(m, alloc.build_step({StepChunk{c, prompt(12, 3), true}}));
  EXPECT_TRUE(m.recording.keys.empty());
  // A mixed step (a decode token next to a prefill chunk): not offered.
  step_both(m, alloc.build_step({StepChunk{a, {7}, false}, StepChunk{c, prompt(4, 4), false}}));
  EXPECT_TRUE(m.recording.keys.empty());

  // Uniform decode at batch 3, several contexts (pages grow): offered, one key.
  for (int i = 0; i < 12; ++i)
    step_both(m, alloc.build_step({StepChunk{a, {i + 1}, false}, StepChunk{b, {i + 2}, false},
                                   StepChunk{c, {i + 3}, false}}));
  ASSERT_EQ(m.recording.keys.size(), 12u);
  const ReplayKey k3 = m.recording.keys.front();
  EXPECT_EQ(k3.owner, m.recorded.get());
  EXPECT_EQ(k3.num_tokens, 3);
  EXPECT_EQ(k3.num_seqs, 3);
  EXPECT_EQ(k3.logit_rows, 3);
  for (const ReplayKey& k : m.recording.keys) EXPECT_TRUE(k == k3);

  // Batch 1: another key of the same buffers.
  step_both(m, alloc.build_step({StepChunk{b, {9}, false}}));
  ASSERT_EQ(m.recording.keys.size(), 13u);
  const ReplayKey k1 = m.recording.keys.back();
  EXPECT_EQ(k1.num_seqs, 1);
  EXPECT_EQ(k1.buffers_generation, k3.buffers_generation);
  EXPECT_FALSE(k1 == k3);

  // A speculative verification step (the last token and 3 drafts of each sequence, a row each):
  // offered as uniform, 4 tokens a sequence.
  step_both(m, alloc.build_step({StepChunk{a, {1, 2, 3, 4}, true}, StepChunk{b, {5, 6, 7, 8}, true}}));
  ASSERT_EQ(m.recording.keys.size(), 14u);
  EXPECT_EQ(m.recording.keys.back().num_tokens, 8);
  EXPECT_EQ(m.recording.keys.back().num_seqs, 2);
  EXPECT_EQ(m.recording.keys.back().logit_rows, 8);
  // One sequence with 4 tokens beside one with 3: not uniform, not offered.
  step_both(m, alloc.build_step({StepChunk{a, {1, 2, 3, 4}, true}, StepChunk{b, {5, 6, 7}, true}}));
  EXPECT_EQ(m.recording.keys.size(), 14u);
}

TEST(ModelReplay, KeyChangesWhenActivationsMove) {
  Models m;
  SimpleKvAllocator alloc(256, m.config.index_block_size);
  std::vector<int> seqs;
  for (int s = 0; s < 20; ++s) {
    seqs.push_back(alloc.add_sequence());
    step_both(m, alloc.build_step({StepChunk{seqs.back(), prompt(3, s), false}}));
  }
  auto decode = [&](int batch) {
    std::vector<StepChunk> chunks;
    for (int s = 0; s < batch; ++s) chunks.push_back(StepChunk{seqs[s], {s + 1}, false});
    step_both(m, alloc.build_step(chunks));
    return m.recording.keys.back();
  };
  const ReplayKey small = decode(4);
  EXPECT_TRUE(decode(4) == small);
  // 20 logits rows outgrow the 16-row minimum: the logits buffers move, the key must change even
  // for the old batch size.
  const ReplayKey big = decode(20);
  EXPECT_GT(big.buffers_generation, small.buffers_generation);
  const ReplayKey small_again = decode(4);
  EXPECT_FALSE(small_again == small);
  EXPECT_EQ(small_again.buffers_generation, big.buffers_generation);
}

}  // namespace
}  // namespace m3
