// Op cases: embed, gather_logits_rows, rms_norm, add_inplace, add_rms_norm, head_norm_rope, over
// the M3 and the tiny geometry, one 37-token prefill chunk behind a long history.
#include <algorithm>

#include <fmt/core.h>

#include "formats/bf16.h"
#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

// Tolerances (max |cuda - cpu| / max |cpu| over an op's output). Outputs are bf16 (relative step
// 2^-8); the backends differ only in fp32 summation order, so an element that lands on the other
// side of a bf16 rounding boundary differs by one bf16 step of itself.
constexpr double kTolExact = 0.0;
constexpr double kTolRounding = 8e-3;  // one bf16 step, relative to the output's scale

constexpr int kVocab = 1000;
constexpr int kSliceBegin = 300, kSliceRows = 400;  // the embed slice case
constexpr float kEps = 1e-6f;
constexpr int kChunkTokens = 37;

enum class Op { kEmbed, kEmbedSlice, kConcatColumns, kGather, kRmsNorm, kAddInplace, kAddRmsNorm, kAddRmsNormSplit };

const char* op_name(Op op) {
  switch (op) {
    case Op::kEmbed: return "embed bf16";
    case Op::kEmbedSlice: return "embed bf16 vocab slice";
    case Op::kConcatColumns: return "concat_column_parts";
    case Op::kGather: return "gather_logits_rows";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kAddInplace: return "add_inplace";
    case Op::kAddRmsNorm: return "add_rms_norm";
    case Op::kAddRmsNormSplit: return "add_rms_norm vs add_inplace + rms_norm";
  }
  return "?";
}

// The row ops: x, y [T, hidden] (N(0, 2)), a norm weight, a bf16 embedding table.
class RowOpCase : public OpCase {
 public:
  // tokens: the chunk's rows (thousands: a prefill chunk, for --perf).
  RowOpCase(Geometry g, Op op, int tokens = kChunkTokens) : g_(std::move(g)), op_(op), tokens_(tokens) {}
  std::string name() const override {
    return g_.name + " " + op_name(op_) + (tokens_ == kChunkTokens ? "" : fmt::format(" {} rows", tokens_));
  }
  Geometry geometry() const override { return g_; }

  void build(std::mt19937_64& rng) override {
    // One sequence: a chunk of tokens_ after a history of several blocks.
    step_ = make_step({{tokens_, 3000 % (g_.block_size * 40) + tokens_}}, g_.block_size, PageLayout::kDisjoint, 0,
                      kVocab, rng);
    const int t = step_.batch.num_tokens();
    x_ = random_values(rng, size_t(t) * g_.hidden, 2.0f);
    y_ = random_values(rng, size_t(t) * g_.hidden, 2.0f);
    norm_ = random_f32(rng, g_.hidden, 0.3f);
    if (op_ == Op::kEmbed || op_ == Op::kEmbedSlice) {
      const std::vector<float> table = random_values(rng, size_t(kVocab) * g_.hidden, 1.0f);
      table_ = Tensor::zeros({kVocab, g_.hidden}, DType::kBF16);
      for (size_t i = 0; i < table.size(); ++i) table_.data_as<uint16_t>()[i] = bf16_encode(table[i]);
    }
  }

  BoundCase bind(Backend& b) const override {
    b.plan(step_.batch);
    const int64_t t = step_.batch.num_tokens(), h = g_.hidden;
    const int64_t rows = int64_t(step_.batch.logits_rows.size());
    const DType act = b.activation_storage_dtype();
    Backend* be = &b;
    Tensor x = act_on_backend(b, x_, t, h), y = act_on_backend(b, y_, t, h);
    const Tensor w = on_backend(b, norm_);
    switch (op_) {
      case Op::kEmbed: {
        const Tensor table = on_backend(b, table_);
        Tensor out = b.alloc({t, h}, act);
        return {[=] { be->embed(table, 0, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
      }
      case Op::kEmbedSlice: {
        // A vocab-parallel rank's rows [kSliceBegin, kSliceBegin + kSliceRows): other ids give zeros.
        const Tensor table = on_backend(b, table_.rows(kSliceBegin, kSliceBegin + kSliceRows));
        Tensor out = b.alloc({t, h}, act);
        return {[=] { be->embed(table, kSliceBegin, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
      }
      case Op::kConcatColumns: {
        // x as 3 parts of t / 3 rows, put back into fewer columns than 3 * hidden (padding dropped).
        const int parts = 3;
        const int64_t rows = t / parts, cols = parts * h - h / 2;
        Tensor in = x.rows(0, rows * parts);
        Tensor out = b.alloc({rows, cols}, act);
        return {[=] { be->concat_column_parts(in, parts, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
      }
      case Op::kGather: {
        Tensor out = b.alloc({rows, h}, act);
        return {[=] { be->gather_logits_rows(x, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
      }
      case Op::kRmsNorm: {
        Tensor out = b.alloc({t, h}, act);
        return {[=] { be->rms_norm(x, w, kEps, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
      }
      case Op::kAddInplace:
        return {[=] { be->add_inplace(x, y); }, [=] { return Outputs{{read_act(*be, x)}}; }};
      case Op::kAddRmsNorm:  // out aliases y, as the model calls it
        return {[=] { be->add_rms_norm(x, y, w, kEps, y); },
                [=] { return Outputs{{read_act(*be, x)}, {read_act(*be, y)}}; }};
      case Op::kAddRmsNormSplit: {
        // The fused kernel's promise: bitwise the backend's own add_inplace + rms_norm.
        Tensor x2 = act_on_backend(b, x_, t, h), y2 = act_on_backend(b, y_, t, h);
        return {[=] {
                  be->add_rms_norm(x, y, w, kEps, y);
                  be->add_inplace(x2, y2);
                  be->rms_norm(x2, w, kEps, y2);
                },
                [=] {
                  return Outputs{{read_act(*be, x)}, {read_act(*be, y)}, {read_act(*be, x2)}, {read_act(*be, y2)}};
                }};
      }
    }
    return {};
  }

  std::vector<Check> checks() const override {
    switch (op_) {
      case Op::kEmbed:
      case Op::kEmbedSlice:
      case Op::kConcatColumns: return {relative_error("", 0, kTolExact)};
      // A copy of the same bf16 rows.
      case Op::kGather: return {relative_error("", 0, kTolExact)};
      case Op::kRmsNorm:
      case Op::kAddInplace: return {relative_error("", 0, kTolRounding)};
      case Op::kAddRmsNorm:
        return {relative_error("residual", 0, kTolRounding), relative_error("", 1, kTolRounding)};
      case Op::kAddRmsNormSplit:
        return {self_differing("(residual)", 0, 2), self_differing("(output)", 1, 3)};
    }
    return {};
  }

  double bytes() const override {
    const double t = step_.batch.num_tokens(), h = g_.hidden, act = 2 * t * h;  // one bf16 [T, hidden]
    switch (op_) {
      case Op::kEmbed:
      case Op::kEmbedSlice:
      case Op::kConcatColumns: return 2 * act;
      case Op::kGather: return 2.0 * 2 * step_.batch.logits_rows.size() * h;
      case Op::kRmsNorm: return 2 * act;
      case Op::kAddInplace: return 3 * act;
      case Op::kAddRmsNorm: return 4 * act;
      case Op::kAddRmsNormSplit: return 0;
    }
    return 0;
  }

 private:
  Geometry g_;
  Op op_;
  int tokens_;
  Step step_;
  std::vector<float> x_, y_;
  Tensor norm_, table_;
};

// head_norm_rope in place on [T, heads * dim]: per-head norm, RoPE over rope_dims channels.
class HeadNormRopeCase : public OpCase {
 public:
  HeadNormRopeCase(Geometry g, int heads, int dim, int rope) : g_(std::move(g)), heads_(heads), dim_(dim), rope_(rope) {}
  std::string name() const override { return fmt::format("{} head_norm_rope {}x{} rope {}", g_.name, heads_, dim_, rope_); }
  Geometry geometry() const override { return g_; }
  void build(std::mt19937_64& rng) override {
    step_ = make_step({{37, 3000 % (g_.block_size * 40) + 37}}, g_.block_size, PageLayout::kDisjoint, 0, kVocab, rng);
    x_ = random_values(rng, size_t(step_.batch.num_tokens()) * heads_ * dim_, 3.0f);
    norm_ = random_f32(rng, dim_, 0.5f);
  }
  BoundCase bind(Backend& b) const override {
    b.plan(step_.batch);
    Tensor x = act_on_backend(b, x_, step_.batch.num_tokens(), int64_t(heads_) * dim_);
    const Tensor w = on_backend(b, norm_);
    Backend* be = &b;
    const int heads = heads_, dim = dim_, rope = rope_;
    return {[=] { be->head_norm_rope(x, heads, dim, w, kEps, rope); }, [=] { return Outputs{{read_act(*be, x)}}; }};
  }
  std::vector<Check> checks() const override { return {relative_error("", 0, kTolRounding)}; }
  double bytes() const override { return 2.0 * 2 * x_.size(); }

 private:
  Geometry g_;
  int heads_, dim_, rope_;
  Step step_;
  std::vector<float> x_;
  Tensor norm_;
};

}  // namespace

void add_elementwise_cases(CaseList& cases, bool) {
  for (const Geometry& g : {m3_geometry(), tiny_geometry()}) {
    for (Op op : {Op::kEmbed, Op::kEmbedSlice, Op::kConcatColumns, Op::kGather, Op::kRmsNorm, Op::kAddInplace, Op::kAddRmsNorm, Op::kAddRmsNormSplit})
      cases.push_back(std::make_unique<RowOpCase>(g, op));
    // Query heads over rotary_dim, index heads over min(rotary_dim, index_dim).
    cases.push_back(std::make_unique<HeadNormRopeCase>(g, g.heads, g.head_dim, g.rotary_dim));
    cases.push_back(std::make_unique<HeadNormRopeCase>(g, g.index_heads, g.index_dim, std::min(g.rotary_dim, g.index_dim)));
  }
  // Row widths for the norms' kernels: M3.1's 6144 (one 16-byte chunk per thread), 16392 (three
  // chunks per thread of 1024) and 100 (not whole chunks: the strided kernels).
  for (const auto& [name, hidden] : {std::pair{"m3-6144", 6144}, std::pair{"m3-16392", 16392}, std::pair{"m3-100", 100}}) {
    Geometry g = m3_geometry();
    g.name = name;
    g.hidden = hidden;
    for (Op op : {Op::kGather, Op::kRmsNorm, Op::kAddRmsNorm, Op::kAddRmsNormSplit})
      cases.push_back(std::make_unique<RowOpCase>(g, op));
  }
  // M3.1's 8,192-row prompt chunk (--perf: the norms' rate against the copy rate; on an H100 in
  // session 47, add_rms_norm moved 98% of the copy rate's bytes, rms_norm 77%).
  Geometry chunk = m3_geometry();
  chunk.name = "m3-6144";
  chunk.hidden = 6144;
  for (Op op : {Op::kRmsNorm, Op::kAddRmsNorm, Op::kAddRmsNormSplit})
    cases.push_back(std::make_unique<RowOpCase>(chunk, op, 8192));
}

}  // namespace m3::test
