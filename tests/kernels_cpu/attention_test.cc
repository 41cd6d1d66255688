// The CPU attention ops (kernels/cpu/attention.h) against brute-force references built from
// scratch the way the Hugging Face model does it: dense [query, key] score and mask matrices over
// each sequence's keys, block max-pooling, forced blocks, top-k with -1 padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "kernels/cpu/attention.h"

namespace m3 {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The value a cache of `dtype` gives back for row x (e4m3_view: the Q8KV4 view of NVFP4).
std::vector<float> stored(KvDType dtype, const float* x, int dim, bool e4m3_view) {
  std::vector<float> y(x, x + dim);
  for (int g = 0; g < (dtype == KvDType::kNVFP4 ? dim / 16 : 0); ++g) {
    uint8_t packed[8], scale;
    nvfp4_kv_encode_group(x + 16 * g, packed, &scale);
    for (int i = 0; i < 16; ++i)
      y[16 * g + i] = e4m3_view ? nvfp4_value_e4m3(nvfp4_code_at(packed, i), scale)
                                : nvfp4_value(nvfp4_code_at(packed, i), scale);
  }
  for (float& v : y) {
    if (dtype == KvDType::kBF16) v = bf16_round(v);
    if (dtype == KvDType::kFP8) v = fp8_e4m3_round(v);
  }
  return y;
}

// Sequences of given lengths in a pool of shuffled blocks, all tokens written with cpu_kv_insert;
// queries are the last q_len tokens of each sequence.
struct World {
  int bs, hkv, d, di, num_blocks;
  KvDType kv, index;
  std::vector<int> lens;
  std::vector<std::vector<float>> k, v, ik;  // per sequence [len, hkv, d] / [len, di]
  std::vector<int32_t> page_table;
  int pages_per_seq = 0;
  std::vector<uint8_t> pool;
  KvLayout layout;
  // query batch
  std::vector<int32_t> positions, token_seq, seq_lens, slots;

  World(int bs_, int hkv_, int d_, int di_, KvDType kv_, KvDType index_, std::vector<int> lens_,
        int q_len, uint32_t seed)
      : bs(bs_), hkv(hkv_), d(d_), di(di_), kv(kv_), index(index_), lens(std::move(lens_)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int len : lens) pages_per_seq = std::max(pages_per_seq, (len + bs - 1) / bs);
    num_blocks = pages_per_seq * static_cast<int>(lens.size()) + 3;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    page_table.assign(lens.size() * pages_per_seq, -1);
    for (size_t s = 0, next = 0; s < lens.size(); ++s)
      for (int p = 0; p < (lens[s] + bs - 1) / bs; ++p) page_table[s * pages_per_seq + p] = ids[next++];
    layout = KvLayout::make(bs, hkv, d, di, kv, index, {true});
    pool.assign(layout.block_bytes * num_blocks, 0xAB);  // garbage where nothing was written
    // Write every token of every sequence in one batch.
    std::vector<int32_t> pos, seq, slot;
    std::vector<float> kall, vall, iall;
    for (size_t s = 0; s < lens.size(); ++s) {
      k.emplace_back(size_t(lens[s]) * hkv * d);
      v.emplace_back(size_t(lens[s]) * hkv * d);
      ik.emplace_back(size_t(lens[s]) * di);
      for (float& x : k[s]) x = normal(rng);
      for (float& x : v[s]) x = normal(rng);
      for (float& x : ik[s]) x = normal(rng);
      kall.insert(kall.end(), k[s].begin(), k[s].end());
      vall.insert(vall.end(), v[s].begin(), v[s].end());
      iall.insert(iall.end(), ik[s].begin(), ik[s].end());
      for (int p = 0; p < lens[s]; ++p) {
        pos.push_back(p);
        seq.push_back(static_cast<int32_t>(s));
        slot.push_back(page_table[s * pages_per_seq + p / bs] * bs + p % bs);
      }
    }
    std::vector<int32_t> all_lens(lens.begin(), lens.end());
    StepView w = view_of(pos, seq, all_lens, slot);
    cpu_kv_insert(w, cache(), kall.data(), vall.data(), iall.data());
    for (size_t s = 0; s < lens.size(); ++s) {
      seq_lens.push_back(lens[s]);
      for (int p = std::max(0, lens[s] - q_len); p < lens[s]; ++p) {
        positions.push_back(p);
        token_seq.push_back(static_cast<int32_t>(s));
        slots.push_back(page_table[s * pages_per_seq + p / bs] * bs + p % bs);
      }
    }
  }
  KvLayerView cache() { return layout.layer_view(pool.data(), 0); }
  StepView view_of(const std::vector<int32_t>& pos, const std::vector<int32_t>& seq,
                             const std::vector<int32_t>& lens_, const std::vector<int32_t>& slot) const {
    StepView w;
    w.num_tokens = static_cast<int>(pos.size());
    w.num_seqs = static_cast<int>(lens_.size());
    w.positions = pos.data();
    w.token_seq = seq.data();
    w.seq_lens = lens_.data();
    w.page_table = page_table.data();
    w.pages_per_seq = pages_per_seq;
    w.slot_mapping = slot.data();
    return w;
  }
  StepView queries() const { return view_of(positions, token_seq, seq_lens, slots); }
  int num_queries() const { return static_cast<int>(positions.size()); }
};

// HF-style indexer: dense scores, token mask, block max-pool, forced blocks, top-k.
std::vector<int32_t> reference_topk(World& w, const std::vector<float>& iq, const IndexerParams& p) {
  std::vector<int32_t> out;
  const bool q8 = e4m3_queries(w.index);
  for (int t = 0; t < w.num_queries(); ++t) {
    const int s = w.token_seq[t], pos = w.positions[t], len = w.lens[s];
    const int nb = (len + w.bs - 1) / w.bs;
    for (int j = 0; j < p.index_heads; ++j) {
      std::vector<float> q(iq.begin() + (size_t(t) * p.index_heads + j) * w.di,
                           iq.begin() + (size_t(t) * p.index_heads + j + 1) * w.di);
      if (q8) for (float& x : q) x = fp8_e4m3_round(x);
      std::vector<float> block(nb, -kInf);
      for (int key = 0; key < len; ++key) {
        if (key > pos) continue;
        const std::vector<float> kk = stored(w.index, w.ik[s].data() + size_t(key) * w.di, w.di, true);
        float dot = 0;
        for (int c = 0; c < w.di; ++c) dot += q[c] * kk[c];
        block[key / w.bs] = std::max(block[key / w.bs], dot);
      }
      const int local = pos / w.bs;
      for (int l = 0; l < p.local_blocks; ++l) block[std::max(local - l, 0)] = kInf;
      for (int b = 0; b < std::min(p.init_blocks, local + 1); ++b) block[b] = kInf;
      std::vector<int> order(nb);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return block[a] > block[b]; });
      const int keep = std::min(p.topk_blocks, nb);
      for (int i = 0; i < p.topk_blocks; ++i)
        out.push_back(i < keep && block[order[i]] != -kInf ? order[i] : -1);
    }
  }
  return out;
}

// HF-style attention: dense logits over the sequence's keys, additive mask, softmax.
void reference_attention(World& w, const std::vector<float>& q, int hq, const int32_t* sel, int topk,
                         float scale, std::vector<float>& out, std::vector<float>& lse) {
  const int group = hq / w.hkv;
  const bool q8kv4 = w.kv == KvDType::kNVFP4;
  out.assign(size_t(w.num_queries()) * hq * w.d, 0.0f);
  lse.assign(size_t(w.num_queries()) * hq, -kInf);
  for (int t = 0; t < w.num_queries(); ++t) {
    const int s = w.token_seq[t], pos = w.positions[t], len = w.lens[s];
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      std::vector<char> allowed((len + w.bs - 1) / w.bs, sel == nullptr);
      if (sel)
        for (int i = 0; i < topk; ++i) {
          const int b = sel[(size_t(t) * w.hkv + g) * topk + i];
          if (b >= 0) allowed[b] = 1;
        }
      std::vector<float> qq(q.begin() + (size_t(t) * hq + h) * w.d, q.begin() + (size_t(t) * hq + h + 1) * w.d);
      if (q8kv4) for (float& x : qq) x = fp8_e4m3_round(x);
      std::vector<float> logit(len, -kInf);
      float m = -kInf;
      for (int key = 0; key < len; ++key) {
        if (key > pos || !allowed[key / w.bs]) continue;
        const auto kk = stored(w.kv, w.k[s].data() + (size_t(key) * w.hkv + g) * w.d, w.d, q8kv4);
        float dot = 0;
        for (int c = 0; c < w.d; ++c) dot += qq[c] * kk[c];
        logit[key] = q8kv4 ? dot : dot * scale;
        m = std::max(m, logit[key]);
      }
      if (m == -kInf) continue;
      double denom = 0;
      std::vector<double> acc(w.d, 0.0);
      for (int key = 0; key < len; ++key) {
        if (logit[key] == -kInf) continue;
        const auto vv = stored(w.kv, w.v[s].data() + (size_t(key) * w.hkv + g) * w.d, w.d, q8kv4);
        double e, pv;
        if (q8kv4) {
          e = 448.0 * std::exp(double(scale) * (logit[key] - m));
          pv = fp8_e4m3_round(static_cast<float>(e));
        } else {
          e = std::exp(double(logit[key]) - m);
          pv = e;
        }
        denom += e;
        for (int c = 0; c < w.d; ++c) acc[c] += pv * vv[c];
      }
      for (int c = 0; c < w.d; ++c) out[(size_t(t) * hq + h) * w.d + c] = static_cast<float>(acc[c] / denom);
      lse[size_t(t) * hq + h] = q8kv4 ? static_cast<float>(scale * m + std::log(denom / 448.0))
                                      : static_cast<float>(m + std::log(denom));
    }
  }
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      ASSERT_EQ(a[i], b[i]) << what << " " << i;
      continue;
    }
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::fabs(double(b[i])))) << what << " element " << i;
  }
}

std::vector<float> random_vec(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

class AttentionOps : public ::testing::TestWithParam<KvDType> {};

TEST_P(AttentionOps, InsertStoresEncodedRows) {
  const KvDType dt = GetParam();
  World w(8, 2, 32, 32, dt, dt, {1, 19, 40}, 4, 11);
  KvLayerView c = w.cache();
  std::vector<float> row(32);
  for (size_t s = 0; s < w.lens.size(); ++s)
    for (int p = 0; p < w.lens[s]; ++p) {
      const int64_t block = w.page_table[s * w.pages_per_seq + p / w.bs];
      for (int h = 0; h < 2; ++h) {
        cpu_kv_decode_row(dt, c.kv_row(block, 1, h, p % w.bs), c.kv_row_scales(block, 1, h, p % w.bs), 32,
                          false, row.data());
        const auto want = stored(dt, w.v[s].data() + (size_t(p) * 2 + h) * 32, 32, false);
        for (int i = 0; i < 32; ++i) ASSERT_EQ(row[i], want[i]) << "seq " << s << " pos " << p;
      }
      cpu_kv_decode_row(dt, c.index_row(block, p % w.bs), c.index_row_scales(block, p % w.bs), 32, false,
                        row.data());
      const auto want = stored(dt, w.ik[s].data() + size_t(p) * 32, 32, false);
      for (int i = 0; i < 32; ++i) ASSERT_EQ(row[i], want[i]);
    }
}

TEST_P(AttentionOps, IndexerTopkMatchesDenseReference) {
  const KvDType dt = GetParam();
  for (auto [local, init, topk] : {std::tuple{1, 0, 4}, std::tuple{2, 0, 5}, std::tuple{1, 1, 3}, std::tuple{3, 0, 2}}) {
    World w(8, 2, 32, 32, dt, dt, {3, 17, 64, 101}, 9, 7 + local * 10 + topk);
    IndexerParams p{2, topk, local, init};
    const auto iq = random_vec(size_t(w.num_queries()) * 2 * 32, 99);
    std::vector<int32_t> got(size_t(w.num_queries()) * 2 * topk);
    cpu_indexer_topk(w.queries(), w.cache(), iq.data(), p, got.data());
    EXPECT_EQ(got, reference_topk(w, iq, p)) << "local " << local << " init " << init << " topk " << topk;
  }
}

TEST_P(AttentionOps, IndexerTiesGoToLowerBlockIds) {
  const KvDType dt = GetParam();
  World w(8, 2, 32, 32, dt, dt, {70}, 3, 5);
  // Every index key equal: every visible history block scores the same.
  for (size_t i = 0; i < w.ik[0].size(); ++i) w.ik[0][i] = w.ik[0][i % 32];
  std::vector<int32_t> pos(70), seq(70, 0), slot(70), lens{70};
  for (int p = 0; p < 70; ++p) {
    pos[p] = p;
    slot[p] = w.page_table[p / 8] * 8 + p % 8;
  }
  std::vector<float> zero_hk(size_t(70) * 2 * 32, 0.0f);
  cpu_kv_insert(w.view_of(pos, seq, lens, slot), w.cache(), zero_hk.data(), zero_hk.data(), w.ik[0].data());
  IndexerParams p{2, 4, 1, 0};
  const auto iq = random_vec(size_t(w.num_queries()) * 2 * 32, 3);
  std::vector<int32_t> got(size_t(w.num_queries()) * 2 * 4);
  cpu_indexer_topk(w.queries(), w.cache(), iq.data(), p, got.data());
  // Query at position 69 (block 8): the forced local block first, then blocks 0, 1, 2.
  const int32_t* last = got.data() + size_t(w.num_queries() - 1) * 2 * 4;
  EXPECT_EQ(std::vector<int32_t>(last, last + 4), (std::vector<int32_t>{8, 0, 1, 2}));
  EXPECT_EQ(got, reference_topk(w, iq, p));
}

TEST_P(AttentionOps, DenseAttentionMatchesReference) {
  const KvDType dt = GetParam();
  World w(8, 2, 32, 32, dt, dt, {1, 9, 33, 77}, 6, 21);
  const auto q = random_vec(size_t(w.num_queries()) * 8 * 32, 4);
  std::vector<float> out(q.size()), lse(size_t(w.num_queries()) * 8), ref_out, ref_lse;
  const float scale = 1.0f / std::sqrt(32.0f);
  cpu_paged_attention(w.queries(), w.cache(), q.data(), 8, nullptr, 0, scale, out.data(), lse.data());
  reference_attention(w, q, 8, nullptr, 0, scale, ref_out, ref_lse);
  expect_close(out, ref_out, 2e-5, "out");
  expect_close(lse, ref_lse, 2e-5, "lse");
}

TEST_P(AttentionOps, SparseAttentionMatchesReference) {
  const KvDType dt = GetParam();
  World w(8, 2, 32, 32, dt, dt, {5, 48, 120}, 10, 31);
  IndexerParams p{2, 4, 1, 0};
  const auto iq = random_vec(size_t(w.num_queries()) * 2 * 32, 8);
  std::vector<int32_t> sel(size_t(w.num_queries()) * 2 * 4);
  cpu_indexer_topk(w.queries(), w.cache(), iq.data(), p, sel.data());
  // One row with every slot -1: no visible key -> output 0, lse -inf.
  std::fill(sel.begin(), sel.begin() + 4, -1);
  const auto q = random_vec(size_t(w.num_queries()) * 8 * 32, 9);
  std::vector<float> out(q.size()), lse(size_t(w.num_queries()) * 8), ref_out, ref_lse;
  const float scale = 0.17f;
  cpu_paged_attention(w.queries(), w.cache(), q.data(), 8, sel.data(), 4, scale, out.data(), lse.data());
  reference_attention(w, q, 8, sel.data(), 4, scale, ref_out, ref_lse);
  expect_close(out, ref_out, 2e-5, "out");
  expect_close(lse, ref_lse, 2e-5, "lse");
  for (int c = 0; c < 32; ++c) EXPECT_EQ(out[c], 0.0f);
  EXPECT_EQ(lse[0], -kInf);
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, AttentionOps,
                         ::testing::Values(KvDType::kF32, KvDType::kBF16, KvDType::kFP8, KvDType::kNVFP4),
                         [](const auto& info) { return std::string(kv_dtype_name(info.param)); });

TEST(AttentionOps, Nvfp4CacheStoresPositiveZero) {
  // Decision 4: zero (and values that round to zero) are always code 0, never -0 (code 8).
  std::vector<float> x(16, 0.0f);
  x[1] = -0.0f;
  x[2] = -1e-6f;
  x[3] = 6.0f;
  uint8_t packed[8], scale;
  nvfp4_kv_encode_group(x.data(), packed, &scale);
  EXPECT_EQ(nvfp4_code_at(packed, 1), 0);
  EXPECT_EQ(nvfp4_code_at(packed, 2), 0);
}

}  // namespace
}  // namespace m3
