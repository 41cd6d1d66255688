// Op cases: the indexer DCP ops (ops/backend.h indexer_topk_candidates, merge_topk_candidates),
// the CUDA backend against the CPU reference, both bit for bit:
//  - "candidates": every cp rank's candidates written into one gathered tensor (the all-gather's
//    layout), then every part's merge of it: equal key bytes and equal selections;
//  - "merge": random gathered keys (ties, forced blocks, empty slots, rows out of order), merged
//    for every part: equal selections (both list the ids ascending).
// On index caches of every dtype with scores that tie a lot ({-1, 0, 1} keys and queries) or not
// (N(0, 1)), over the two op-check geometries, with the parts and cp sizes of TP 2..4 and uneven
// splits. That the merged selection equals indexer_topk's is the CPU test's job
// (tests/kernels_cpu/indexer_dcp_test.cc).
#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <fmt/core.h>

#include "kernels/cpu/attention.h"
#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

enum class DcpOp { kCandidates, kMerge };

struct DcpSetup {
  Geometry geometry;  // index heads per part, index dim, block size, top-k, forcing
  KvDType index_dtype = KvDType::kBF16;
  bool ternary = true;  // {-1, 0, 1} keys and queries: many exact score ties
  int parts = 1, cp = 1;
  std::vector<SeqSpec> seqs;
};

std::vector<float> dcp_values(std::mt19937_64& rng, size_t n, bool ternary) {
  if (!ternary) return random_values(rng, n, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = float(int(rng() % 3) - 1);
  return v;
}

class DcpCase : public OpCase {
 public:
  DcpCase(std::string name, DcpSetup setup, DcpOp op) : name_(std::move(name)), s_(std::move(setup)), op_(op) {}
  std::string name() const override { return name_; }
  Geometry geometry() const override { return s_.geometry; }

  void build(std::mt19937_64& rng) override {
    const Geometry& g = s_.geometry;
    step_ = make_step(s_.seqs, g.block_size, PageLayout::kPermuted, 0, 1000, rng);
    const StepBatch& b = step_.batch;
    const int tokens = b.num_tokens();
    if (op_ == DcpOp::kMerge) {
      gathered_ = random_gathered(rng);
      return;
    }
    layout_ = KvLayout::make(g.block_size, g.kv_heads, g.head_dim, g.index_dim, KvDType::kBF16, s_.index_dtype, {true});
    pool_ = Tensor::zeros({layout_.block_bytes * step_.num_blocks}, DType::kU8);
    std::memset(pool_.data(), 0x5a, pool_.nbytes());
    // Every slot up to seq_len holds an index key (K and V: zeros, unread).
    std::vector<int32_t> slots;
    for (int s = 0; s < b.num_seqs(); ++s)
      for (int p = 0; p < b.seq_lens[s]; ++p)
        slots.push_back(b.page_table[size_t(s) * b.pages_per_seq + p / g.block_size] * g.block_size + p % g.block_size);
    StepView fill;
    fill.num_tokens = int(slots.size());
    fill.slot_mapping = slots.data();
    const std::vector<float> kv(slots.size() * g.kv_heads * g.head_dim, 0.0f);
    const std::vector<float> ik = dcp_values(rng, slots.size() * g.index_dim, s_.ternary);
    cpu_kv_insert(fill, layout_.layer_view(pool_.data_as<uint8_t>(), 0), kv.data(), kv.data(), ik.data());
    index_q_parts_ = dcp_values(rng, size_t(s_.parts) * tokens * g.index_heads * g.index_dim, s_.ternary);
  }

  BoundCase bind(Backend& b) const override {
    const Geometry& g = s_.geometry;
    b.plan(step_.batch);
    const int64_t tokens = step_.batch.num_tokens();
    const int64_t per_rank = s_.parts * tokens * g.index_heads * g.topk;
    const IndexerParams params = indexer();
    const int cp = s_.cp, parts = s_.parts;
    Backend* be = &b;
    Tensor selection = b.alloc({parts, tokens * g.index_heads * g.topk}, DType::kI32);
    poison(selection, 0x7f);
    auto merge_all = [=](const Tensor& gathered) {
      for (int part = 0; part < parts; ++part)
        be->merge_topk_candidates(gathered, cp, parts, part, params, selection.rows(part, part + 1));
    };
    if (op_ == DcpOp::kMerge) {
      const Tensor gathered = on_backend(b, gathered_);
      return {[=] { merge_all(gathered); }, [=] { return Outputs{Output(read_bytes(selection))}; }};
    }
    const Tensor pool = on_backend(b, pool_);
    const KvLayerView cache = layout_.layer_view(pool.data_as<uint8_t>(), 0);
    const Tensor iq = act_on_backend(b, index_q_parts_, parts * tokens, int64_t(g.index_heads) * g.index_dim);
    Tensor gathered = b.alloc({cp, per_rank}, DType::kI64);
    poison(gathered, 0x5a);
    // Every launch holds the pool: `cache` points into it.
    return {[=, pool = pool] {
              for (int r = 0; r < cp; ++r)
                be->indexer_topk_candidates(cache, iq, parts, params, cp, r, gathered.rows(r, r + 1));
              merge_all(gathered);
            },
            [=] { return Outputs{Output(read_bytes(gathered)), Output(read_bytes(selection))}; }};
  }

  std::vector<Check> checks() const override {
    if (op_ == DcpOp::kMerge) return {bytes_differing("selection bytes differing", 0, 0)};
    return {bytes_differing("candidate key bytes differing", 0, 0), bytes_differing("selection bytes differing", 1, 0)};
  }

  // The index cache each rank reads once per sequence (all ranks: the whole cache), the queries.
  double bytes() const override {
    if (op_ == DcpOp::kMerge) return double(gathered_.nbytes());
    const Geometry& g = s_.geometry;
    double keys = 0;
    for (int32_t len : step_.batch.seq_lens) keys += len;
    const double row = kv_data_bytes(s_.index_dtype, g.index_dim) + kv_scale_bytes(s_.index_dtype, g.index_dim);
    return keys * row + 2.0 * index_q_parts_.size() * s_.cp;
  }

 private:
  IndexerParams indexer() const {
    const Geometry& g = s_.geometry;
    return {g.index_heads, g.topk, g.local_blocks, g.init_blocks};
  }

  // Gathered candidates as ranks could send them: per (rank, part, token, head) up to k distinct
  // blocks of the rank's slice with scores from a few values (+inf: forced), packed, in a random
  // order among empty (0) slots.
  Tensor random_gathered(std::mt19937_64& rng) const {
    const Geometry& g = s_.geometry;
    const StepBatch& b = step_.batch;
    const int tokens = b.num_tokens(), topk = g.topk;
    Tensor out = Tensor::zeros({s_.cp, int64_t(s_.parts) * tokens * g.index_heads * topk}, DType::kI64);
    int64_t* keys = out.data_as<int64_t>();
    const float scores[] = {-2.0f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f, std::numeric_limits<float>::infinity()};
    for (int r = 0; r < s_.cp; ++r)
      for (int p = 0; p < s_.parts; ++p)
        for (int t = 0; t < tokens; ++t) {
          const int local = b.positions[t] / g.block_size;
          const int mine = local >= r ? (local - r) / s_.cp + 1 : 0;
          const int k = std::min(topk, (b.seq_lens[b.token_seq[t]] + g.block_size - 1) / g.block_size);
          for (int h = 0; h < g.index_heads; ++h) {
            int64_t* row = keys + (((size_t(r) * s_.parts + p) * tokens + t) * g.index_heads + h) * topk;
            const int n = mine ? int(rng() % uint64_t(std::min(k, mine) + 1)) : 0;
            std::set<int> picked;
            while (int(picked.size()) < n) picked.insert(r + int(rng() % uint64_t(mine)) * s_.cp);
            int i = 0;
            for (int block : picked) row[i++] = indexer_candidate_key(scores[rng() % 7], block);
            std::shuffle(row, row + topk, rng);
          }
        }
    return out;
  }

  std::string name_;
  DcpSetup s_;
  DcpOp op_;
  Step step_;
  KvLayout layout_;
  Tensor pool_, gathered_;
  std::vector<float> index_q_parts_;  // [parts * T, Hl * Di]
};

}  // namespace

void add_dcp_cases(CaseList& cases, bool quick) {
  // (parts, cp): TP 2 and 4 as deployed (cp = parts), cp 3 over 4 parts, one rank.
  const std::vector<std::pair<int, int>> splits =
      quick ? std::vector<std::pair<int, int>>{{4, 4}, {4, 3}} : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 4}, {4, 3}, {2, 4}};
  for (const Geometry& g : {m3_geometry(), tiny_geometry()}) {
    const bool m3 = g.head_dim == 128;
    // (new tokens, KV length): decode, drafts, a prefill chunk, a long decode, a fresh prompt.
    const std::vector<SeqSpec> seqs = m3 ? std::vector<SeqSpec>{{1, 300}, {4, 2100}, {24, 2200}, {1, 5000}, {9, 9}}
                                         : std::vector<SeqSpec>{{1, 20}, {3, 90}, {40, 150}, {1, 700}, {5, 5}};
    for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kFP8, KvDType::kNVFP4})
      for (bool ternary : {true, false}) {
        if (quick && !ternary && dtype != KvDType::kNVFP4) continue;
        for (const auto& [parts, cp] : splits) {
          const DcpSetup s{g, dtype, ternary, parts, cp, seqs};
          cases.push_back(std::make_unique<DcpCase>(
              fmt::format("{} dcp index {} {} parts {} cp {} candidates+merge", g.name, kv_dtype_name(dtype),
                          ternary ? "ternary" : "normal", parts, cp),
              s, DcpOp::kCandidates));
        }
      }
    for (const auto& [parts, cp] : splits)
      cases.push_back(std::make_unique<DcpCase>(fmt::format("{} dcp parts {} cp {} merge of random keys", g.name, parts, cp),
                                                DcpSetup{g, KvDType::kBF16, true, parts, cp, seqs}, DcpOp::kMerge));
  }
}

}  // namespace m3::test
