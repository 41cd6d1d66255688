// Op cases: the DSpark drafter's two ops (ops/backend.h draft_block_attention, markov_drafts).
// Attention: blocks of 7 queries over contexts shorter and longer than the window, in each cache
// dtype the drafter keeps (f32, bf16, fp8), on the M3 geometry (GQA 16, head_dim 128: the M3.1
// drafter's heads) and the tiny one (the tiled kernel on the tensor cores, keys split over CTAs: K, V
// and the weights in bf16, so an f32 cache is compared within a bf16 step), and on a head_dim of 40
// (the simple kernel). Markov: greedy drafts over a vocabulary that does not fill the
// kernel's last chunk, ranks 16 and 256 (the M3.1 drafter's), with and without the Markov state in
// the confidence head, and 3 drafts of a block of 7 (the heads read only those rows).
#include <cmath>
#include <memory>

#include <fmt/core.h>

#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

constexpr int kBlockLen = 7;
constexpr double kTolRounding = 8e-3;  // one bf16 step of the output, relative to its scale

class DraftAttentionCase : public OpCase {
 public:
  DraftAttentionCase(Geometry g, KvDType kv, std::vector<SeqSpec> seqs, int window)
      : g_(std::move(g)), kv_(kv), seqs_(std::move(seqs)), window_(window) {}
  std::string name() const override {
    return fmt::format("{} draft_block_attention {} window {} ({} blocks)", g_.name, kv_dtype_name(kv_), window_,
                       seqs_.size());
  }
  Geometry geometry() const override { return g_; }
  void build(std::mt19937_64& rng) override {
    step_ = make_step(seqs_, g_.block_size, PageLayout::kDisjoint, 0, 1000, rng);
    layout_ = KvLayout::make(g_.block_size, g_.kv_heads, g_.head_dim, 0, kv_, kv_, {false});
    pool_ = encode_pool(layout_, step_.batch, step_.num_blocks, /*with_step_tokens=*/false, rng);
    const size_t t = step_.batch.num_tokens();
    q_ = random_values(rng, t * g_.heads * g_.head_dim, 1.0f);
    k_ = random_values(rng, t * g_.kv_heads * g_.head_dim, 1.0f);
    v_ = random_values(rng, t * g_.kv_heads * g_.head_dim, 1.0f);
  }
  BoundCase bind(Backend& b) const override {
    b.plan(step_.batch);
    const Tensor pool = on_backend(b, pool_);
    const KvLayerView cache = layout_.layer_view(pool.data_as<uint8_t>(), 0);
    const int64_t t = step_.batch.num_tokens(), q_cols = int64_t(g_.heads) * g_.head_dim;
    const int64_t kv_cols = int64_t(g_.kv_heads) * g_.head_dim;
    const Tensor q = act_on_backend(b, q_, t, q_cols), k = act_on_backend(b, k_, t, kv_cols);
    const Tensor v = act_on_backend(b, v_, t, kv_cols);
    Tensor out = b.alloc({t, q_cols}, b.activation_storage_dtype());
    poison(out, 0xff);
    const float scale = 1.0f / std::sqrt(float(g_.head_dim));
    Backend* be = &b;
    const int heads = g_.heads, window = window_;
    return {[=, pool = pool] { be->draft_block_attention(cache, q, heads, k, v, kBlockLen, window, scale, out); },
            [=] { return Outputs{{read_act(*be, out)}}; }};
  }
  std::vector<Check> checks() const override { return {relative_error("", 0, kTolRounding)}; }
  double bytes() const override {
    double keys = 0;  // each block's context in its window, K and V of every KV head, read once
    for (const SeqSpec& s : seqs_) keys += std::min(s.seq_len - kBlockLen, window_ + kBlockLen - 1);
    return keys * 2.0 * g_.kv_heads * g_.head_dim * kv_data_bytes(kv_, 1);
  }

 private:
  Geometry g_;
  KvDType kv_;
  std::vector<SeqSpec> seqs_;
  int window_;
  Step step_;
  KvLayout layout_;
  Tensor pool_;
  std::vector<float> q_, k_, v_;
};

class MarkovCase : public OpCase {
 public:
  // heads: the drafts of each block of kBlockLen queries (its first rows are the logits rows).
  MarkovCase(Geometry g, int blocks, int64_t vocab, int rank, bool with_markov, int heads = kBlockLen)
      : g_(std::move(g)), blocks_(blocks), vocab_(vocab), rank_(rank), with_markov_(with_markov), heads_(heads) {}
  std::string name() const override {
    return fmt::format("{} markov_drafts vocab {} rank {}{} ({} blocks, {} drafts of {})", g_.name, vocab_, rank_,
                       with_markov_ ? "" : " confidence without markov", blocks_, heads_, kBlockLen);
  }
  Geometry geometry() const override { return g_; }
  void build(std::mt19937_64& rng) override {
    std::vector<SeqSpec> seqs(blocks_, SeqSpec{kBlockLen, 300});
    step_ = make_step(seqs, g_.block_size, PageLayout::kDisjoint, 0, static_cast<int>(vocab_), rng);
    step_.batch.logits_rows.clear();
    for (int s = 0; s < blocks_; ++s)
      for (int j = 0; j < heads_; ++j) step_.batch.logits_rows.push_back(s * kBlockLen + j);
    const size_t t = step_.batch.logits_rows.size();
    base_ = random_values(rng, t * vocab_, 3.0f);
    normed_ = random_values(rng, t * g_.hidden, 1.0f);
    auto f32 = [&](int64_t rows, int64_t cols, float scale) {
      Tensor x = Tensor::zeros({rows, cols}, DType::kF32);
      const std::vector<float> v = random_values(rng, size_t(rows * cols), scale);
      std::copy(v.begin(), v.end(), x.data_as<float>());
      return x;
    };
    head_.w1 = f32(vocab_, rank_, 1.0f);
    head_.w2 = f32(vocab_, rank_, 1.0f / std::sqrt(float(rank_)));
    head_.confidence_w = f32(1, g_.hidden + (with_markov_ ? rank_ : 0), 0.05f).reshape({g_.hidden + (with_markov_ ? rank_ : 0)});
    head_.confidence_b = 0.25f;
    head_.confidence_with_markov = with_markov_;
  }
  BoundCase bind(Backend& b) const override {
    b.plan(step_.batch);
    const int64_t t = static_cast<int64_t>(step_.batch.logits_rows.size());
    const Tensor base = act_on_backend(b, base_, t, vocab_), normed = act_on_backend(b, normed_, t, g_.hidden);
    MarkovHeadWeights head = head_;
    head.w1 = on_backend(b, head_.w1);
    head.w2 = on_backend(b, head_.w2);
    head.confidence_w = on_backend(b, head_.confidence_w);
    auto ids = std::make_shared<std::vector<int32_t>>(t, -7);
    auto conf = std::make_shared<std::vector<float>>(t, NAN);
    Backend* be = &b;
    const int heads = heads_;
    return {[=] { be->markov_drafts(base, normed, head, heads, ids->data(), conf->data()); },
            [=] { return Outputs{ids_output(*ids), Output(*conf)}; }};
  }
  std::vector<Check> checks() const override {
    // Both backends sum in one order without contraction: the ids agree (a near-tie decided otherwise
    // would also change the drafts after it in its block); confidences within fp32 rounding.
    const int rows = blocks_ * heads_;
    return {{fmt::format("ids differing (of {})", rows), 0,
             [](const Outputs& got, const Outputs& want) {
               const std::vector<int32_t> a = output_ids(got[0]), b = output_ids(want[0]);
               if (a.size() != b.size()) return 1e9;
               int bad = 0;
               for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
               return double(bad);
             }},
            relative_error("confidence", 1, 1e-5)};
  }
  double bytes() const override {
    const double rows = double(blocks_) * heads_;
    return rows * vocab_ * 2.0 + heads_ * 4.0 * vocab_ * rank_;  // base rows; w2 once per draft
  }

 private:
  Geometry g_;
  int blocks_;
  int64_t vocab_;
  int rank_;
  bool with_markov_;
  int heads_;
  Step step_;
  std::vector<float> base_, normed_;
  MarkovHeadWeights head_;
};

}  // namespace

void add_draft_cases(CaseList& cases, bool quick) {
  // head_dim 40 is no multiple of 16: the simple kernel (one CTA per token and KV head) takes it.
  const Geometry odd{"odd-head-dim", 80, 4, 1, 40, 1, 0, 16, 4, 1, 0, 16};
  cases.push_back(std::make_unique<DraftAttentionCase>(odd, KvDType::kBF16, std::vector<SeqSpec>{{7, 8}, {7, 90}}, 40));
  for (const Geometry& g : {m3_geometry(), tiny_geometry()}) {
    const bool m3 = g.head_dim == 128;
    // (new tokens, KV length): blocks of 7 after contexts inside and past the window.
    const std::vector<SeqSpec> seqs = m3 ? std::vector<SeqSpec>{{7, 8}, {7, 300}, {7, 2200}, {7, 5000}}
                                         : std::vector<SeqSpec>{{7, 8}, {7, 40}, {7, 150}};
    const int window = m3 ? 4096 : 64;
    for (KvDType kv : {KvDType::kF32, KvDType::kBF16, KvDType::kFP8}) {
      if (quick && m3 && kv == KvDType::kF32) continue;
      cases.push_back(std::make_unique<DraftAttentionCase>(g, kv, seqs, window));
    }
  }
  cases.push_back(std::make_unique<MarkovCase>(tiny_geometry(), 3, 5000, 16, true));
  cases.push_back(std::make_unique<MarkovCase>(tiny_geometry(), 2, 9000, 16, false));
  cases.push_back(std::make_unique<MarkovCase>(tiny_geometry(), 2, 3000, 20, true));  // a rank that is no multiple of 8
  cases.push_back(std::make_unique<MarkovCase>(tiny_geometry(), 4, 5000, 16, true, 3));  // 3 drafts of a block of 7
  cases.push_back(std::make_unique<MarkovCase>(m3_geometry(), quick ? 33 : 70, 20000, 256, true));
  cases.push_back(std::make_unique<MarkovCase>(m3_geometry(), 16, 20000, 256, true, 3));
}

}  // namespace m3::test
