// Op cases of --batch-invariant (CudaBackendOptions::batch_invariant): on a backend made with it, a
// row computed alone is BITWISE the same row computed inside a batch of 3, 32, 200 or 300 rows,
// at the batch's first, middle and last position (so at different places of the kernels' row
// tiles and, for the MoE, of its experts' permuted rows). Each case also checks the batch against
// the CPU reference, so that the mode stays correct, not only repeatable. Ops: linear in every
// weight format, linears (fused projections), swiglu_mlp, moe; and on the MSA kernels (the M3
// shape) indexer_topk and sparse and dense paged_attention: rows of a prefill chunk, in a step
// with other sequences, against each of them alone as a decode step over the same pool.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/kernels_cuda/attention_case.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

// As cases_linear.cc: one bf16 step + fp32 summation order.
constexpr double kTolGemm = 1.2e-2;
constexpr int kHidden = 256;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

struct Format {
  const char* name;
  WeightFormat format;
  DType dense = DType::kBF16;
  float divisor = 0.0f;  // nvfp4: compressed-tensors global divisor (0: ModelOpt)
};
const Format kBf16{"bf16", WeightFormat::kDense, DType::kBF16};
const Format kF32{"f32", WeightFormat::kDense, DType::kF32};  // the SIMT kernel
const Format kFp8{"fp8", WeightFormat::kFp8};
const Format kMxfp8{"mxfp8", WeightFormat::kMxfp8};
const Format kNvfp4Modelopt{"nvfp4-modelopt", WeightFormat::kNvfp4};
const Format kNvfp4Ct{"nvfp4-ct", WeightFormat::kNvfp4, DType::kBF16, 448.0f * 6.0f * 8.0f};

LinearWeight weight(std::mt19937_64& rng, const char* name, int64_t out, int64_t in, const Format& f) {
  return random_linear(rng, name, out, in, f.format, f.dense, f.divisor);
}

// The op on one backend: x [rows, in] -> outs [rows, widths[i]].
using BoundOp = std::function<void(const Tensor& x, const std::vector<Tensor>& outs)>;

// A batch of rows_ random rows with one probe row copied to its first, middle and last position,
// and the probe alone. Outputs: 0 the probe's rows alone (once per position), 1 the batch's rows
// at those positions, 2 the whole batch (against the CPU reference); the outputs' widths laid
// side by side.
class InvarianceCase : public OpCase {
 public:
  InvarianceCase(std::string op, int rows, int in, std::vector<int> widths)
      : op_(std::move(op)), rows_(rows), in_(in), widths_(std::move(widths)) {}
  std::string name() const override { return fmt::format("batch-invariant {} rows {}", op_, rows_); }
  Geometry geometry() const override {
    Geometry g{"batch-invariant", kHidden, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32};
    g.batch_invariant = true;
    return g;
  }
  void build(std::mt19937_64& rng) override {
    build_weights(rng);
    x_ = random_values(rng, size_t(rows_) * in_, 1.0f);
    probe_ = random_values(rng, in_, 1.0f);
    for (int p : positions()) std::copy(probe_.begin(), probe_.end(), x_.begin() + int64_t(p) * in_);
  }
  BoundCase bind(Backend& b) const override {
    const BoundOp op = bind_op(b);
    const Tensor alone_x = act_on_backend(b, probe_, 1, in_), batch_x = act_on_backend(b, x_, rows_, in_);
    std::vector<Tensor> alone, batch;
    for (int w : widths_) {
      alone.push_back(b.alloc({1, w}, b.activation_storage_dtype()));
      batch.push_back(b.alloc({rows_, w}, b.activation_storage_dtype()));
      poison(alone.back(), 0x7e);  // an element the op leaves unwritten differs
      poison(batch.back(), 0x7e);
    }
    Backend* be = &b;
    const std::vector<int> widths = widths_, at = positions();
    return {[=] {
              op(alone_x, alone);
              op(batch_x, batch);
            },
            [=] {
              Outputs o(3);
              for (size_t i = 0; i < widths.size(); ++i) {
                const std::vector<float> a = read_act(*be, alone[i]), full = read_act(*be, batch[i]);
                for (int p : at) {
                  o[0].values.insert(o[0].values.end(), a.begin(), a.end());
                  o[1].values.insert(o[1].values.end(), full.begin() + int64_t(p) * widths[i],
                                     full.begin() + int64_t(p + 1) * widths[i]);
                }
                o[2].values.insert(o[2].values.end(), full.begin(), full.end());
              }
              return o;
            }};
  }
  std::vector<Check> checks() const override {
    return {self_differing("alone vs in batch (bitwise)", 0, 1), relative_error("batch vs cpu", 2, kTolGemm)};
  }

 protected:
  virtual void build_weights(std::mt19937_64& rng) = 0;
  virtual BoundOp bind_op(Backend& b) const = 0;

 private:
  std::vector<int> positions() const { return {0, rows_ / 2, rows_ - 1}; }
  std::string op_;
  int rows_, in_;
  std::vector<int> widths_;
  std::vector<float> x_, probe_;
};

class LinearInvariance : public InvarianceCase {
 public:
  LinearInvariance(Format f, int n, int k, int rows)
      : InvarianceCase(fmt::format("linear {} {}x{}", f.name, n, k), rows, k, {n}), f_(f), n_(n), k_(k) {}

 protected:
  void build_weights(std::mt19937_64& rng) override { w_ = weight(rng, "w", n_, k_, f_); }
  BoundOp bind_op(Backend& b) const override {
    const LinearWeight w = on_backend(b, w_);
    Backend* be = &b;
    return [=](const Tensor& x, const std::vector<Tensor>& outs) { be->linear(x, w, outs[0]); };
  }

 private:
  Format f_;
  int n_, k_;
  LinearWeight w_;
};

// The attention projections' shapes in small (q, k, v, index q, index k), as cases_linear.cc.
const std::vector<int> kProjections = {256, 32, 40, 48, 16};

class LinearsInvariance : public InvarianceCase {
 public:
  LinearsInvariance(std::vector<Format> formats, int rows)
      : InvarianceCase(fmt::format("linears {}", names(formats)), rows, kHidden, kProjections),
        formats_(std::move(formats)) {}

 protected:
  void build_weights(std::mt19937_64& rng) override {
    for (size_t i = 0; i < kProjections.size(); ++i)
      w_.push_back(weight(rng, "w", kProjections[i], kHidden, formats_[i % formats_.size()]));
  }
  BoundOp bind_op(Backend& b) const override {
    auto weights = std::make_shared<std::vector<LinearWeight>>();
    for (const LinearWeight& w : w_) weights->push_back(on_backend(b, w));
    Backend* be = &b;
    return [=](const Tensor& x, const std::vector<Tensor>& outs) {
      std::vector<LinearOutput> o;
      for (size_t i = 0; i < outs.size(); ++i) o.push_back({&(*weights)[i], outs[i]});
      be->linears(x, o);
    };
  }

 private:
  static std::string names(const std::vector<Format>& formats) {
    std::string s;
    for (const Format& f : formats) {
      if (!s.empty()) s += "+";
      s += f.name;
    }
    return s;
  }
  std::vector<Format> formats_;
  std::vector<LinearWeight> w_;
};

constexpr int kMlpInter = 192;

class SwigluInvariance : public InvarianceCase {
 public:
  SwigluInvariance(Format f, int rows)
      : InvarianceCase(fmt::format("swiglu_mlp {}", f.name), rows, kHidden, {kHidden}), f_(f) {}

 protected:
  void build_weights(std::mt19937_64& rng) override {
    gate_ = weight(rng, "gate", kMlpInter, kHidden, f_);
    up_ = weight(rng, "up", kMlpInter, kHidden, f_);
    down_ = weight(rng, "down", kHidden, kMlpInter, f_);
  }
  BoundOp bind_op(Backend& b) const override {
    const LinearWeight g = on_backend(b, gate_), u = on_backend(b, up_), d = on_backend(b, down_);
    Backend* be = &b;
    return [=](const Tensor& x, const std::vector<Tensor>& outs) {
      be->swiglu_mlp(x, g, u, d, kAlpha, kLimit, outs[0]);
    };
  }

 private:
  Format f_;
  LinearWeight gate_, up_, down_;
};

constexpr int kMoeInter = 128;

// 300 tokens of E8 k2 take the tiled router and 128-row expert items without the mode.
class MoeInvariance : public InvarianceCase {
 public:
  MoeInvariance(Format routed, Format shared, int experts, int top_k, int rows)
      : InvarianceCase(fmt::format("moe {} experts, {} shared E{} k{}", routed.name, shared.name, experts, top_k), rows,
                       kHidden, {kHidden}),
        routed_(routed), shared_(shared), experts_(experts), top_k_(top_k) {}

 protected:
  void build_weights(std::mt19937_64& rng) override {
    mlp_.gate = weight(rng, "shared.gate", kMoeInter, kHidden, shared_);
    mlp_.up = weight(rng, "shared.up", kMoeInter, kHidden, shared_);
    mlp_.down = weight(rng, "shared.down", kHidden, kMoeInter, shared_);
    mlp_.router = random_f32(rng, int64_t(experts_) * kHidden, 0.08f).reshape({experts_, kHidden});
    mlp_.router_bias = Tensor::zeros({experts_}, DType::kF32);
    for (int e = 0; e < experts_; ++e) mlp_.router_bias.data_as<float>()[e] = 0.01f * float(e % 5);
    for (int e = 0; e < experts_; ++e)
      mlp_.experts.push_back({weight(rng, "e.gate", kMoeInter, kHidden, routed_),
                              weight(rng, "e.up", kMoeInter, kHidden, routed_),
                              weight(rng, "e.down", kHidden, kMoeInter, routed_)});
  }
  BoundOp bind_op(Backend& b) const override {
    const MlpWeights mlp = on_backend(b, mlp_);
    MoeParams params;
    params.num_experts = experts_;
    params.experts_per_token = top_k_;
    params.routed_scaling_factor = 2.0f;
    Backend* be = &b;
    return [=](const Tensor& x, const std::vector<Tensor>& outs) { be->moe(x, mlp, params, outs[0]); };
  }

 private:
  Format routed_, shared_;
  int experts_, top_k_;
  MlpWeights mlp_;
};

// The probes: rows of sequence 0's chunk (its first, middle and last), each also run alone as
// a one-token decode step at its position over the same pages (keys past it exist in the pool
// but are not visible, as for that row inside the chunk). Outputs: 0 the probes alone, 1 the
// probes' rows in the step, 2 (attention) the step's whole output against the CPU reference.
// The indexer has no output 2: its ids may differ from the CPU's on near-ties of block scores
// (cases_msa.cc judges those); alone vs in the step they may not.
class AttentionInvariance : public AttentionCase {
 public:
  AttentionInvariance(AttentionSetup s, AttentionOp op, double tolerance, std::vector<int> probes)
      : AttentionCase(fmt::format("batch-invariant {} kv {} seqs {}", attention_op_name(op), kv_name(s.kv_dtype),
                                  seqs_name(s.seqs)),
                      with_mode(s), op),
        tolerance_(tolerance), probes_(std::move(probes)) {}
  void build(std::mt19937_64& rng) override {
    AttentionCase::build(rng);
    const StepBatch& b = step_.batch;
    alone_.clear();
    for (int p : probes_) {
      StepBatch a;
      a.token_ids = {b.token_ids[p]};
      a.positions = {b.positions[p]};
      a.token_seq = {0};
      a.query_start = {0, 1};
      a.seq_lens = {b.positions[p] + 1};
      a.pages_per_seq = b.pages_per_seq;
      a.page_table.assign(b.page_table.begin(), b.page_table.begin() + b.pages_per_seq);
      a.slot_mapping = {b.slot_mapping[p]};
      a.logits_rows = {0};
      alone_.push_back(std::move(a));
    }
  }
  BoundCase bind(Backend& b) const override {
    const Geometry& g = s_.geometry;
    const bool indexer_op = op_ == AttentionOp::kIndexer;
    const Tensor pool = on_backend(b, pool_);
    const KvLayerView cache = layout_.layer_view(pool.data_as<uint8_t>(), 0);
    const int64_t t = tokens();
    const int64_t q_cols = indexer_op ? int64_t(g.index_heads) * g.index_dim : int64_t(g.heads) * g.head_dim;
    const int64_t out_cols = indexer_op ? int64_t(g.index_heads) * g.topk : int64_t(g.heads) * g.head_dim;
    const int64_t sel_cols = int64_t(g.kv_heads) * g.topk;  // sparse attention's selection per token
    const std::vector<float>& q_host = indexer_op ? index_q_ : q_;
    auto out_tensor = [&](int64_t rows) {
      Tensor out = indexer_op ? b.alloc({rows * out_cols}, DType::kI32) : b.alloc({rows, out_cols}, b.activation_storage_dtype());
      poison(out, indexer_op ? 0x7f : 0xff);
      return out;
    };
    struct Run {
      const StepBatch* step;
      Tensor q, sel, out;
    };
    std::vector<Run> runs = {{&step_.batch, act_on_backend(b, q_host, t, q_cols),
                              op_ == AttentionOp::kSparse ? on_backend(b, selection_) : Tensor(), out_tensor(t)}};
    for (size_t i = 0; i < probes_.size(); ++i) {
      const int p = probes_[i];
      const std::vector<float> q(q_host.begin() + p * q_cols, q_host.begin() + (p + 1) * q_cols);
      Tensor sel;
      if (op_ == AttentionOp::kSparse) {
        Tensor host = Tensor::zeros({sel_cols}, DType::kI32);
        std::copy_n(selection_.data_as<const int32_t>() + p * sel_cols, sel_cols, host.data_as<int32_t>());
        sel = on_backend(b, host);
      }
      runs.push_back({&alone_[i], act_on_backend(b, q, 1, q_cols), sel, out_tensor(1)});
    }
    Backend* be = &b;
    const IndexerParams params = indexer();
    const float sm_scale = 1.0f / std::sqrt(float(g.head_dim));
    const AttentionOp op = op_;
    const std::vector<int> probes = probes_;
    // Every launch holds the pool: `cache` points into it.
    return {[=, pool = pool] {
              for (const Run& r : runs) {
                be->plan(*r.step);
                if (op == AttentionOp::kIndexer) be->indexer_topk(cache, r.q, params, r.out);
                else be->paged_attention(cache, r.q, g.heads, r.sel, g.topk, sm_scale, r.out);
              }
            },
            [=] {
              Outputs o(indexer_op ? 2 : 3);
              auto rows_of = [&](const Tensor& out) {  // as floats: bytes of I32 ids compare bitwise too
                if (!indexer_op) return read_act(*be, out);
                const std::vector<int32_t> ids = output_ids(Output(read_bytes(out)));
                return std::vector<float>(ids.begin(), ids.end());
              };
              const std::vector<float> all = rows_of(runs[0].out);
              for (size_t i = 0; i < probes.size(); ++i) {
                const std::vector<float> alone = rows_of(runs[i + 1].out);
                o[0].values.insert(o[0].values.end(), alone.begin(), alone.end());
                o[1].values.insert(o[1].values.end(), all.begin() + probes[i] * out_cols,
                                   all.begin() + (probes[i] + 1) * out_cols);
              }
              if (!indexer_op) o[2].values = all;
              return o;
            }};
  }
  std::vector<Check> checks() const override {
    std::vector<Check> c = {self_differing("alone vs in step (bitwise)", 0, 1)};
    if (op_ != AttentionOp::kIndexer) c.push_back(relative_error("step vs cpu", 2, tolerance_));
    return c;
  }

 private:
  static AttentionSetup with_mode(AttentionSetup s) {  // a copy: the name reads s too
    s.geometry.batch_invariant = true;
    return s;
  }
  static const char* kv_name(KvDType d) { return d == KvDType::kFP8 ? "fp8" : d == KvDType::kNVFP4 ? "nvfp4" : "bf16"; }
  static std::string seqs_name(const std::vector<SeqSpec>& seqs) {
    std::string s;
    for (const SeqSpec& q : seqs) s += fmt::format("{}{}/{}", s.empty() ? "" : ",", q.q_len, q.seq_len);
    return s;
  }
  double tolerance_;
  std::vector<int> probes_;
  std::vector<StepBatch> alone_;
};

}  // namespace

void add_batch_invariance_cases(CaseList& cases, bool quick) {
  const std::vector<int> batches = quick ? std::vector<int>{3, 300} : std::vector<int>{3, 32, 200, 300};
  for (int rows : batches) {
    for (const Format& f : {kBf16, kF32, kFp8, kMxfp8, kNvfp4Modelopt, kNvfp4Ct})
      cases.push_back(std::make_unique<LinearInvariance>(f, 256, 1024, rows));
    // Fused into one launch when the formats agree (bf16 too, in this mode); a mixed group: one by one.
    const std::vector<std::vector<Format>> groups = {{kBf16}, {kFp8}, {kMxfp8}, {kNvfp4Ct}, {kMxfp8, kNvfp4Ct}};
    for (const std::vector<Format>& fs : groups)
      cases.push_back(std::make_unique<LinearsInvariance>(fs, rows));
    for (const Format& f : {kBf16, kFp8, kMxfp8, kNvfp4Ct}) cases.push_back(std::make_unique<SwigluInvariance>(f, rows));
    cases.push_back(std::make_unique<MoeInvariance>(kNvfp4Ct, kMxfp8, 16, 4, rows));
    cases.push_back(std::make_unique<MoeInvariance>(kNvfp4Modelopt, kBf16, 8, 2, rows));
    cases.push_back(std::make_unique<MoeInvariance>(kNvfp4Ct, kMxfp8, 128, 4, rows));  // the M3.1 routing
  }
  // Sequence 0: a 38-token chunk at positions 2962..2999 (24 blocks: the top-k of 16 selects) whose
  // last dense group holds two rows; beside it a decode row and another chunk. Probes: its rows 0,
  // 17 and 37.
  const std::vector<SeqSpec> step = {{38, 3000}, {1, 300}, {50, 2500}};
  for (KvDType kv : {KvDType::kBF16, KvDType::kFP8}) {
    const double tol = kv == KvDType::kBF16 ? 5e-2 : 1e-1;
    for (AttentionOp op : {AttentionOp::kIndexer, AttentionOp::kSparse, AttentionOp::kDense})
      cases.push_back(std::make_unique<AttentionInvariance>(AttentionSetup{m3_geometry(), kv, kv, step}, op, tol,
                                                            std::vector<int>{0, 17, 37}));
  }
  // Dense attention past 256 blocks (32768 tokens): positions 32762..32769, whose second group of
  // four would straddle the change from one chunk of blocks to two. Probes: 32767 (one chunk) and
  // 32769 (two).
  if (!quick)
    cases.push_back(std::make_unique<AttentionInvariance>(
        AttentionSetup{m3_geometry(), KvDType::kBF16, KvDType::kBF16, {{8, 32770}, {1, 500}}}, AttentionOp::kDense, 5e-2,
        std::vector<int>{5, 7}));
}

}  // namespace m3::test
