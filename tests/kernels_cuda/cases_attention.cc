// Op cases: the attention-side ops over the two op-check geometries (the M3 shape, which takes the
// MSA kernels, and a tiny one, which takes the generic kernels) in every KV dtype.
#include <algorithm>
#include <climits>

#include <fmt/core.h>

#include "tests/kernels_cuda/attention_case.h"

namespace m3::test {
namespace {

// Tolerances (max |cuda - cpu| / max |cpu| over an op's output). Outputs are bf16 (relative step
// 2^-8); the backends differ only in fp32 summation order, so an element that lands on the other
// side of a bf16 rounding boundary differs by one bf16 step of itself.
constexpr double kTolExact = 0.0;
constexpr double kTolRounding = 8e-3;  // one bf16 step, relative to the output's scale
constexpr double kTolGemm = 1.2e-2;    // + fp32 order over long dot products
// The nvfp4 (Q8KV4) probability path of the MSA kernels: section 6 of docs/reference.md allows 3e-2
// (prefill rows) and 5e-2 (decode rows) per element; these steps mix both.
constexpr double kTolQ8KV4 = 5e-2;

// Sorts each selection row's valid ids ascending (-1 last): the CPU lists them by score, the MSA
// kernels by id; the attention ops take either.
std::vector<int32_t> sorted_selection(const Output& output, int topk) {
  std::vector<int32_t> sel = output_ids(output);
  for (size_t r = 0; r + topk <= sel.size(); r += topk)
    std::sort(sel.begin() + r, sel.begin() + r + topk, [](int32_t a, int32_t b) {
      return (a < 0 ? INT32_MAX : a) < (b < 0 ? INT32_MAX : b);
    });
  return sel;
}

class OpCheckAttentionCase : public AttentionCase {
 public:
  using AttentionCase::AttentionCase;
  std::vector<Check> checks() const override {
    switch (op_) {
      case AttentionOp::kInput:
        // Cache bytes: exact when the normed rows agree exactly; count differing bytes.
        return {relative_error("q", 0, kTolRounding), relative_error("k", 1, kTolRounding),
                relative_error("index_k", 2, kTolRounding), bytes_differing("cache bytes differing", 3, 64.0),
                relative_error("index_q", 4, kTolRounding)};
      case AttentionOp::kInsert:
        // From identical bf16 rows the encoders agree bit for bit.
        return {bytes_differing("cache bytes differing", 0, kTolExact)};
      case AttentionOp::kIndexer: {
        const int rows = tokens() * s_.geometry.index_heads, topk = s_.geometry.topk;
        // Near-ties of block scores may order differently under another summation order.
        return {{fmt::format("rows differing (of {})", rows), std::max(1.0, 0.02 * rows),
                 [rows, topk](const Outputs& got, const Outputs& want) {
                   const std::vector<int32_t> a = sorted_selection(got[0], topk);
                   const std::vector<int32_t> b = sorted_selection(want[0], topk);
                   int bad = 0;
                   for (int r = 0; r < rows; ++r)
                     bad += !std::equal(a.begin() + r * topk, a.begin() + (r + 1) * topk, b.begin() + r * topk);
                   return double(bad);
                 }}};
      }
      case AttentionOp::kSparse:
      case AttentionOp::kDense:
        return {relative_error("", 0, s_.kv_dtype == KvDType::kNVFP4 ? kTolQ8KV4 : kTolGemm)};
    }
    return {};
  }
};

}  // namespace

void add_attention_cases(CaseList& cases, bool quick) {
  for (const Geometry& g : {m3_geometry(), tiny_geometry()})
    for (KvDType kv : {KvDType::kF32, KvDType::kBF16, KvDType::kFP8, KvDType::kNVFP4}) {
      const bool m3 = g.head_dim == 128;
      if (quick && kv == KvDType::kF32 && m3) continue;
      AttentionSetup s;
      s.geometry = g;
      s.kv_dtype = s.index_dtype = kv;
      // (new tokens, KV length): decode rows, a few draft tokens, a prefill chunk.
      s.seqs = m3 ? (quick ? std::vector<SeqSpec>{{1, 300}, {4, 2100}, {24, 2200}}
                           : std::vector<SeqSpec>{{1, 300}, {4, 2100}, {64, 2500}, {1, 4000}})
                  : std::vector<SeqSpec>{{1, 20}, {3, 90}, {40, 150}};
      for (AttentionOp op : {AttentionOp::kInput, AttentionOp::kInsert, AttentionOp::kIndexer, AttentionOp::kSparse,
                             AttentionOp::kDense})
        cases.push_back(std::make_unique<OpCheckAttentionCase>(
            fmt::format("{} kv {} {}", g.name, kv_dtype_name(kv), attention_op_name(op)), s, op));
    }
  // A prefill chunk of 4,100 tokens: the attention input's warps then walk several rows of their
  // token (from 2,048 tokens one CTA a token), encoded rows after normed ones in the same buffer.
  if (!quick)
    for (KvDType kv : {KvDType::kBF16, KvDType::kNVFP4}) {
      AttentionSetup s;
      s.geometry = m3_geometry();
      s.kv_dtype = s.index_dtype = kv;
      s.seqs = {{1, 300}, {4100, 4100}};
      cases.push_back(std::make_unique<OpCheckAttentionCase>(
          fmt::format("{} kv {} {} 4101 tokens", s.geometry.name, kv_dtype_name(kv), attention_op_name(AttentionOp::kInput)),
          s, AttentionOp::kInput));
    }
}

}  // namespace m3::test
