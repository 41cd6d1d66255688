// Op cases: the MSA kernels (kernels/cuda/msa.h) through the CUDA backend, in the shapes the
// serving path gives them: KV insert (bit-exact pools), indexer + top-k (exact ids up to exact
// score ties), sparse and dense attention (the tolerances of docs/reference.md 6, per row),
// poisoned outputs, several page-table layouts (permuted, disjoint, a shared prefix), sizes that
// are not multiples of the tiles, long contexts, other indexer parameters, an index dtype apart
// from the KV dtype; and, calling the kernels directly (msa.h), what no backend op reaches: E4M3
// activations and the attention's LSE output. (CUDA-graph replay of these kernels: backend_check
// graphs, on an M3-shaped model.)
#include <cmath>
#include <set>

#include <fmt/core.h>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/msa.h"
#include "tests/kernels_cuda/attention_case.h"

namespace m3::test {
namespace {

// The indexer's E4M3 scores are wgmma sums, and Hopper's FP8 tensor cores truncate as they add:
// `msa_bench --fp8-mma-probe` measured sums over k = 128 off by up to 1.0e-3 of the sum of
// |products| (about 10 bits of it; kernels/cuda/wgmma.cuh), whatever the dot product's own size.
// Where the products cancel that is far above 1e-4 of the score, and two blocks that close may
// swap places in the top-k (seed 3 of prefill_q8kv4_tp4 did). The allowance: 2^-9 of each block's
// largest sum of |products|, twice the probe's worst, still far below the score differences a
// wrong block, scale or key makes.
constexpr double kFp8AccumulationError = 1.0 / 512;

// docs/reference.md 6, per path and row kind (decode rows: sequences with <= 16 new tokens).
struct Tolerance {
  float atol, rtol, lse;
  bool cosine;  // cosine >= 0.999 per output row (Q8KV8 in the vendor's suite; bf16 here too)
};
Tolerance tolerance(KvDType dtype, bool decode_row) {
  switch (dtype) {
    case KvDType::kNVFP4: return decode_row ? Tolerance{5e-2f, 5e-2f, 5e-4f, false} : Tolerance{3e-2f, 3e-2f, 5e-4f, false};
    case KvDType::kFP8: return decode_row ? Tolerance{5e-2f, 5e-2f, 3e-3f, true} : Tolerance{3e-2f, 1e-1f, 3e-3f, true};
    default: return {3e-2f, 3e-2f, 1e-3f, true};
  }
}

class MsaCase : public AttentionCase {
 public:
  using AttentionCase::AttentionCase;
  std::vector<Check> checks() const override {
    switch (op_) {
      case AttentionOp::kInsert:
        return {bytes_differing("pool bytes differing", 0, 0)};
      case AttentionOp::kIndexer:
        return {{"selection rows wrong beyond score ties", 0,
                 [this](const Outputs& got, const Outputs& want) { return selection_failures(got, want); }}};
      case AttentionOp::kSparse:
      case AttentionOp::kDense:
        return {{"outputs outside section 5 + rows under cosine 0.999", 0,
                 [this](const Outputs& got, const Outputs& want) { return attention_failures(got, want); }}};
      case AttentionOp::kInput: break;
    }
    return {};
  }

 protected:
  // Exact block score (double) as ops/attention.h defines it, for judging score ties, with the
  // largest sum of |products| over the block's visible keys (the scale of the GPU's rounding).
  struct BlockScore {
    double score = -INFINITY, magnitude = 0.0;
  };
  BlockScore block_score(const KvLayerView& cache, int token, const float* iq, int block) const {
    const StepBatch& b = step_.batch;
    const int bs = cache.block_size, pos = b.positions[token];
    const int64_t phys = b.page_table[size_t(b.token_seq[token]) * b.pages_per_seq + block];
    const bool q8 = e4m3_queries(cache.index_dtype);
    std::vector<float> key(cache.index_dim);
    BlockScore best;
    for (int r = 0; r < bs && block * bs + r <= pos; ++r) {
      cpu_kv_decode_row(cache.index_dtype, cache.index_row(phys, r), cache.index_row_scales(phys, r), cache.index_dim,
                        true, key.data());
      double s = 0.0, m = 0.0;
      for (int i = 0; i < cache.index_dim; ++i) {
        const double p = double(q8 ? fp8_e4m3_round(iq[i]) : iq[i]) * key[i];
        s += p;
        m += std::fabs(p);
      }
      best.score = std::max(best.score, s);
      best.magnitude = std::max(best.magnitude, m);
    }
    return best;
  }

  // Rows (token, index head) whose selection is malformed (unwritten, out of range, a duplicate or
  // a gap before -1), of another size, or holds a block whose score differs from the one it
  // replaces by more than a near-tie: 1e-4 relative, plus the FP8 accumulation's rounding above on
  // E4M3 scores.
  double selection_failures(const Outputs& got, const Outputs& want) const {
    const std::vector<int32_t> gpu = output_ids(got[0]), cpu = output_ids(want[0]);
    const StepBatch& b = step_.batch;
    const KvLayerView cache = layout_.layer_view(const_cast<uint8_t*>(pool_.data_as<const uint8_t>()), 0);
    const int hi = s_.geometry.index_heads, topk = s_.geometry.topk, di = cache.index_dim;
    const bool q8 = e4m3_queries(cache.index_dtype);
    int failures = 0;
    for (int t = 0; t < b.num_tokens(); ++t)
      for (int h = 0; h < hi; ++h) {
        const int32_t* cr = cpu.data() + (size_t(t) * hi + h) * topk;
        const int32_t* gr = gpu.data() + (size_t(t) * hi + h) * topk;
        const int local = b.positions[t] / cache.block_size;
        std::set<int> cs, gs;
        bool shape_ok = true, seen_pad = false;
        for (int i = 0; i < topk; ++i) {
          if (cr[i] >= 0) cs.insert(cr[i]);
          if (gr[i] == -1) seen_pad = true;
          else if (gr[i] < 0 || gr[i] > local || seen_pad || !gs.insert(gr[i]).second) shape_ok = false;
        }
        if (!shape_ok || cs.size() != gs.size()) {
          ++failures;
          continue;
        }
        if (cs == gs) continue;
        std::vector<int> only_cpu, only_gpu;
        for (int x : cs) if (!gs.count(x)) only_cpu.push_back(x);
        for (int x : gs) if (!cs.count(x)) only_gpu.push_back(x);
        const float* q = index_q_.data() + (size_t(t) * hi + h) * di;
        for (size_t i = 0; i < only_cpu.size(); ++i) {
          const BlockScore a = block_score(cache, t, q, only_cpu[i]), g = block_score(cache, t, q, only_gpu[i]);
          const double allowance = 1e-4 * (std::fabs(a.score) + std::fabs(g.score)) + 1e-6 +
                                   (q8 ? kFp8AccumulationError * (a.magnitude + g.magnitude) : 0.0);
          if (std::fabs(a.score - g.score) > allowance) {
            ++failures;
            break;
          }
        }
      }
    return failures;
  }

  // Output elements outside the row's atol + rtol * |cpu| (or not finite), plus rows whose cosine
  // to the CPU's is under 0.999 where section 5 asks for it. The first failing rows go to stderr
  // (token, sequence, position, head, the worst element), so that a failure says where it is.
  double attention_failures(const Outputs& got, const Outputs& want) const {
    const std::vector<float>& g_out = got[0].values;
    const std::vector<float>& c_out = want[0].values;
    const StepBatch& b = step_.batch;
    const std::vector<bool> decode = decode_tokens(b);
    const int d = s_.geometry.head_dim, heads = s_.geometry.heads;
    const int rows = tokens() * heads;
    int bad = 0, reported = 0;
    for (int r = 0; r < rows; ++r) {
      const Tolerance tol = tolerance(s_.kv_dtype, decode[r / heads]);
      double dot = 0, na = 0, nb = 0, worst = 0;
      int row_bad = 0, worst_i = 0;
      for (int i = 0; i < d; ++i) {
        const float a = c_out[size_t(r) * d + i], g = g_out[size_t(r) * d + i];
        if (!std::isfinite(g) || std::fabs(g - a) > tol.atol + tol.rtol * std::fabs(a)) ++row_bad;
        const double diff = std::isfinite(g) ? std::fabs(double(g) - a) : INFINITY;
        if (diff > worst) worst = diff, worst_i = i;
        dot += double(a) * g, na += double(a) * a, nb += double(g) * g;
      }
      const double cosine = na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : (na == nb ? 1.0 : 0.0);
      if (tol.cosine && !(cosine >= 0.999)) ++row_bad;
      bad += row_bad;
      if (row_bad > 0 && reported++ < 6) {
        const int t = r / heads;
        fmt::print(stderr, "  token {} (seq {}, pos {}) head {}: {} failing, worst |d| {:.4f} at dim {} (cpu {:.4f}), "
                   "cosine {:.5f}\n", t, b.token_seq[t], b.positions[t], r % heads, row_bad, worst, worst_i,
                   c_out[size_t(r) * d + worst_i], cosine);
      }
    }
    return bad;
  }
};

// The MSA kernels called directly, not through a backend op: q / index-q as E4M3 or bf16 (the
// backend always gives bf16) and the attention's LSE [T, Hq] (the backend asks for none). On the
// CPU side the reference functions of kernels/cpu/attention.h on the same host inputs (E4M3 codes
// decoded). Outputs: kIndexer: the selection; kSparse, kDense: the output, the LSE.
class MsaKernelCase : public MsaCase {
 public:
  MsaKernelCase(std::string name, AttentionSetup setup, AttentionOp op, cuda::ActDType act)
      : MsaCase(std::move(name), std::move(setup), op), act_(act) {}

  void build(std::mt19937_64& rng) override {
    AttentionCase::build(rng);
    std::vector<float>& acts = op_ == AttentionOp::kIndexer ? index_q_ : q_;
    act_bytes_.clear();
    for (float& v : acts) {
      if (act_ == cuda::ActDType::kE4M3) {
        act_bytes_.push_back(fp8_e4m3_encode(v));
        v = fp8_e4m3_decode(act_bytes_.back());
      } else {
        const uint16_t bits = bf16_encode(v);
        act_bytes_.push_back(uint8_t(bits & 0xff));
        act_bytes_.push_back(uint8_t(bits >> 8));
      }
    }
  }

  BoundCase bind(Backend& b) const override {
    return b.device() == Device::kCpu ? bind_reference() : bind_kernels(b);
  }

  std::vector<Check> checks() const override {
    if (op_ == AttentionOp::kIndexer) return MsaCase::checks();
    std::vector<Check> c = MsaCase::checks();
    c.push_back({"lse values outside section 5", 0,
                 [this](const Outputs& got, const Outputs& want) { return lse_failures(got, want); }});
    return c;
  }

 private:
  float sm_scale() const { return 1.0f / std::sqrt(float(s_.geometry.head_dim)); }
  const int32_t* selection() const {
    return op_ == AttentionOp::kSparse ? selection_.data_as<const int32_t>() : nullptr;
  }

  BoundCase bind_reference() const {
    const Geometry& g = s_.geometry;
    const size_t t = tokens();
    auto pool = std::make_shared<std::vector<uint8_t>>(pool_.data_as<const uint8_t>(),
                                                       pool_.data_as<const uint8_t>() + pool_.nbytes());
    const KvLayerView cache = layout_.layer_view(pool->data(), 0);
    const StepView view = host_step_view(step_.batch);
    if (op_ == AttentionOp::kIndexer) {
      auto sel = std::make_shared<std::vector<int32_t>>(t * g.index_heads * g.topk, 0x7f7f7f7f);
      const IndexerParams params = indexer();
      // Every launch holds the pool: `cache` points into it.
      return {[=, this, pool = pool] { cpu_indexer_topk(view, cache, index_q_.data(), params, sel->data()); },
              [=] { return Outputs{ids_output(*sel)}; }};
    }
    auto out = std::make_shared<std::vector<float>>(t * g.heads * g.head_dim, NAN);
    auto lse = std::make_shared<std::vector<float>>(t * g.heads, NAN);
    return {[=, this, pool = pool] {
              cpu_paged_attention(view, cache, q_.data(), g.heads, selection(), g.topk, sm_scale(), out->data(),
                                  lse->data());
            },
            [=] { return Outputs{Output(*out), Output(*lse)}; }};
  }

  BoundCase bind_kernels(Backend& b) const {
    using namespace cuda::testing;
    const Geometry& g = s_.geometry;
    const size_t t = tokens();
    cudaStream_t stream = static_cast<cudaStream_t>(cuda_backend_stream(b));
    cuda::MsaConfig config;
    config.num_q_heads = g.heads;
    config.num_kv_heads = g.kv_heads;
    config.indexer = indexer();
    auto plan = std::make_shared<cuda::MsaPlan>(config);
    auto step = std::make_shared<DeviceStep>(upload_step(step_.batch));
    plan->plan(step_.batch, step->view, stream);
    std::vector<uint8_t> pool_bytes(pool_.data_as<const uint8_t>(), pool_.data_as<const uint8_t>() + pool_.nbytes());
    auto pool = std::make_shared<DeviceMem>(upload(pool_bytes));
    const KvLayerView cache = layout_.layer_view(pool->as<uint8_t>(), 0);
    auto acts = std::make_shared<DeviceMem>(upload(act_bytes_));
    const cuda::ActDType act = act_;
    if (op_ == AttentionOp::kIndexer) {
      auto sel = std::make_shared<DeviceMem>(t * g.index_heads * g.topk * 4);
      MSA_CUDA(cudaMemset(sel->as(), 0x7f, sel->bytes()));
      // Every launch holds the step and the pool (the plan and `cache` point into them).
      return {[=, step = step, pool = pool] { plan->indexer_topk(cache, acts->as(), act, sel->as<int32_t>(), stream); },
              [=] {
                MSA_CUDA(cudaStreamSynchronize(stream));
                return Outputs{Output(download<uint8_t>(*sel, sel->bytes()))};
              }};
    }
    std::vector<int32_t> host_sel;
    if (op_ == AttentionOp::kSparse)
      host_sel.assign(selection_.data_as<const int32_t>(), selection_.data_as<const int32_t>() + selection_.numel());
    auto sel = std::make_shared<DeviceMem>(upload(host_sel));
    const bool sparse = op_ == AttentionOp::kSparse;
    const size_t n_out = t * g.heads * g.head_dim, n_lse = t * g.heads;
    auto out = std::make_shared<DeviceMem>(n_out * 2), lse = std::make_shared<DeviceMem>(n_lse * 4);
    MSA_CUDA(cudaMemset(out->as(), 0xff, out->bytes()));  // poisoned: NaN where nothing writes
    MSA_CUDA(cudaMemset(lse->as(), 0xff, lse->bytes()));
    const float scale = sm_scale();
    return {[=, step = step, pool = pool] {
              plan->attention(cache, acts->as(), act, sparse ? sel->as<int32_t>() : nullptr, scale,
                              out->as<uint16_t>(), lse->as<float>(), stream);
            },
            [=] {
              MSA_CUDA(cudaStreamSynchronize(stream));
              const std::vector<uint16_t> bits = download<uint16_t>(*out, n_out);
              std::vector<float> values(n_out);
              for (size_t i = 0; i < n_out; ++i) values[i] = bf16_decode(bits[i]);
              return Outputs{Output(std::move(values)), Output(download<float>(*lse, n_lse))};
            }};
  }

  // LSE values (natural log) further than section 5's tolerance from the CPU's; -inf (no key)
  // must be matched exactly.
  double lse_failures(const Outputs& got, const Outputs& want) const {
    const std::vector<float>& g = got.at(1).values;
    const std::vector<float>& c = want.at(1).values;
    const std::vector<bool> decode = decode_tokens(step_.batch);
    const int heads = s_.geometry.heads;
    int bad = 0;
    for (size_t r = 0; r < c.size(); ++r) {
      const float la = c[r], lg = g[r];
      const bool row_bad = std::isinf(la) || std::isinf(lg)
                               ? la != lg
                               : !(std::fabs(double(la) - lg) <= tolerance(s_.kv_dtype, decode[r / heads]).lse);
      if (row_bad && bad < 6) {
        const size_t t = r / heads;
        fmt::print(stderr, "  token {} (seq {}, pos {}) head {}: lse {:.6f}, cpu {:.6f}\n", t, step_.batch.token_seq[t],
                   step_.batch.positions[t], r % heads, lg, la);
      }
      bad += row_bad;
    }
    return bad;
  }

  cuda::ActDType act_;
  std::vector<uint8_t> act_bytes_;  // q or index-q as the kernels read them (E4M3 or bf16 bytes)
};

struct MsaShape {
  std::string name;
  KvDType kv, index;
  int q_heads, kv_heads;
  std::vector<SeqSpec> seqs;
  PageLayout layout = PageLayout::kPermuted;
  int shared_blocks = 0;
  int topk = 16, local = 1, init = 0;
  cuda::ActDType act = cuda::ActDType::kBF16;  // of the direct kernel cases
};

std::vector<MsaShape> shapes(bool quick) {
  using enum KvDType;
  std::vector<MsaShape> out;
  // Decode, TP4 shape, nvfp4 everywhere: short (all blocks kept), exactly 17 blocks, long.
  out.push_back({"decode_q8kv4_tp4", kNVFP4, kNVFP4, 16, 1, {{8, 3000}, {8, 20 * 128 + 5}, {8, 900}, {8, 17 * 128}, {1, 129}}});
  // Decode, full heads, fp8, mixed draft lengths.
  out.push_back({"decode_fp8_h64", kFP8, kFP8, 64, 4, {{1, 5000}, {4, 2300}, {3, 4097}, {2, 2049}}, PageLayout::kDisjoint});
  if (quick) return out;
  // Decode, GQA 8, bf16, shared prefix, 16 queries per request.
  out.push_back({"decode_bf16_g8_shared", kBF16, kBF16, 32, 4, {{16, 3100}, {16, 2900}, {5, 2700}},
                 PageLayout::kSharedPrefix, 12});
  // Chunked prefill: a chunk against a long history, and a fresh 77-token prompt.
  out.push_back({"prefill_q8kv4_tp4", kNVFP4, kNVFP4, 16, 1, {{200, 2500}, {77, 77}, {130, 4000}}});
  // bf16 KV with an nvfp4 index, other forcing parameters (8 blocks, 2 local, 1 initial), E4M3
  // activations (the direct kernel cases).
  out.push_back({"prefill_bf16kv_fp4idx_init", kBF16, kNVFP4, 64, 4, {{40, 3000}, {9, 1500}}, PageLayout::kPermuted, 0, 8,
                 2, 1, cuda::ActDType::kE4M3});
  // No forced local block: the local block is scored with its causal mask.
  out.push_back({"mixed_fp8_nolocal", kFP8, kFP8, 16, 1, {{1, 2600}, {64, 2700}, {8, 1999}}, PageLayout::kSharedPrefix, 8,
                 12, 0, 0});
  // Long contexts: indexer items of several blocks, dense attention split into many pieces.
  out.push_back({"decode_long_q8kv4", kNVFP4, kNVFP4, 16, 1, {{8, 40000}, {8, 35000}, {4, 50001}, {8, 30000}}});
  // Rows alone that see few keys (fresh short prompts, early decode steps): each score moves its
  // row's P8 roundings and LSE, so these need the scores summed at fp32 accuracy.
  out.push_back({"decode_q8kv4_short", kNVFP4, kNVFP4, 16, 1, {{1, 1}, {2, 2}, {1, 3}, {4, 9}, {8, 30}, {1, 64}, {3, 70}}});
  // Prefill row groups over nvfp4 KV, GQA 8 (heads past the group are zero columns): a long
  // context (random selections share few blocks: a group's union is mostly one row's), a fresh
  // 40-token prompt and a 9-block one (every row selects every visible block; 3- and 4-row groups).
  out.push_back({"prefill_q8kv4_g8_groups", kNVFP4, kNVFP4, 32, 4, {{96, 20000}, {40, 40}, {70, 1100}}});
  // nvfp4 KV with fp8 index, prefill + decode mixed, GQA 16 full heads.
  out.push_back({"mixed_q8kv4_fp8idx_h64", kNVFP4, kFP8, 64, 4, {{3, 6000}, {50, 2000}, {1, 300}}, PageLayout::kDisjoint});
  return out;
}

}  // namespace

void add_msa_cases(CaseList& cases, bool quick) {
  for (const MsaShape& m : shapes(quick)) {
    AttentionSetup s;
    // Block 128, head and index dims 128 (the MSA shape), one index head per KV head.
    s.geometry = {"msa " + m.name, 1024, m.q_heads, m.kv_heads, 128, m.kv_heads, 128, 128, m.topk, m.local, m.init, 64};
    s.kv_dtype = m.kv;
    s.index_dtype = m.index;
    s.seqs = m.seqs;
    s.layout = m.layout;
    s.shared_prefix_blocks = m.shared_blocks;
    const std::string tag = fmt::format("msa {} kv {} index {} pages {}", m.name, kv_dtype_name(m.kv),
                                        kv_dtype_name(m.index), cuda::testing::page_layout_name(m.layout));
    for (AttentionOp op : {AttentionOp::kInsert, AttentionOp::kIndexer, AttentionOp::kSparse, AttentionOp::kDense})
      cases.push_back(std::make_unique<MsaCase>(tag + " " + attention_op_name(op), s, op));
    const bool e4m3 = m.act == cuda::ActDType::kE4M3;
    const std::string kernel_tag = fmt::format("{} kernels q {} +lse", tag, e4m3 ? "e4m3" : "bf16");
    std::vector<AttentionOp> kernel_ops{AttentionOp::kSparse, AttentionOp::kDense};
    if (e4m3) kernel_ops.insert(kernel_ops.begin(), AttentionOp::kIndexer);
    for (AttentionOp op : kernel_ops)
      cases.push_back(std::make_unique<MsaKernelCase>(kernel_tag + " " + attention_op_name(op), s, op, m.act));
  }
}

}  // namespace m3::test
