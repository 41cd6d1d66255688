// Op cases: linear in every WeightFormat (skinny, tiled, SIMT and wgmma paths by row count),
// swiglu_mlp, moe (all experts, expert-parallel subsets, routed only).
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

// Tolerance (max |cuda - cpu| / max |cpu| over an op's output): one bf16 step (8e-3, see
// cases_elementwise.cc) + fp32 summation order over long dot products.
constexpr double kTolGemm = 1.2e-2;

// The backends of these cases: plain attention, no index; only hidden and the RoPE table matter.
Geometry mlp_geometry(const char* name, int hidden) { return {name, hidden, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32}; }

struct FormatCase {
  const char* name;
  WeightFormat format;
  DType dense = DType::kBF16;
  float divisor = 0.0f;
};
const FormatCase kFormats[] = {
    {"bf16", WeightFormat::kDense, DType::kBF16},    {"f32", WeightFormat::kDense, DType::kF32},
    {"f16", WeightFormat::kDense, DType::kF16},      {"fp8", WeightFormat::kFp8},
    {"fp8-block", WeightFormat::kFp8Block},          {"mxfp8", WeightFormat::kMxfp8},
    {"nvfp4-modelopt", WeightFormat::kNvfp4},        {"nvfp4-ct", WeightFormat::kNvfp4, DType::kBF16, 448.0f * 6.0f * 8.0f},
};

LinearWeight random_weight(std::mt19937_64& rng, const char* name, int64_t out, int64_t in, const FormatCase& f) {
  return random_linear(rng, name, out, in, f.format, f.dense, f.divisor);
}

class LinearCase : public OpCase {
 public:
  // mx_exp_shift: added to every MXFP8 block exponent (the weights times 2^shift), so that blocks
  // above kMxfp8FastMaxExp (134) take the kernels' exact float expansion beside fast ones.
  LinearCase(FormatCase f, int n, int k, int rows, int mx_exp_shift = 0)
      : f_(f), n_(n), k_(k), rows_(rows), mx_exp_shift_(mx_exp_shift) {}
  std::string name() const override {
    const std::string shift = mx_exp_shift_ ? fmt::format(" (block exponents +{})", mx_exp_shift_) : "";
    return fmt::format("linear {}{} {}x{} rows {}", f_.name, shift, n_, k_, rows_);
  }
  Geometry geometry() const override { return mlp_geometry("linear", 256); }
  void build(std::mt19937_64& rng) override {
    w_ = random_weight(rng, "w", n_, k_, f_);
    if (mx_exp_shift_ != 0) {
      for (uint8_t& e : w_.scale.span<uint8_t>()) e = uint8_t(std::min(254, e + mx_exp_shift_));
    }
    x_ = random_values(rng, size_t(rows_) * k_, 1.0f);
  }
  BoundCase bind(Backend& b) const override {
    const Tensor x = act_on_backend(b, x_, rows_, k_);
    const LinearWeight w = on_backend(b, w_);
    const Tensor out = b.alloc({rows_, n_}, b.activation_storage_dtype());
    Backend* be = &b;
    return {[=] { be->linear(x, w, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
  }
  std::vector<Check> checks() const override { return {relative_error("", 0, kTolGemm)}; }
  double bytes() const override { return double(w_.nbytes()) + 2.0 * rows_ * (k_ + n_); }
  double flops() const override { return 2.0 * rows_ * n_ * k_; }

 private:
  FormatCase f_;
  int n_, k_, rows_;
  int mx_exp_shift_;
  LinearWeight w_;
  std::vector<float> x_;
};

// Backend::linears: several weights over one input (the attention projections), fused into one
// launch on the GPU when they share a quantized format; a mixed group takes linear() each.
class LinearsCase : public OpCase {
 public:
  LinearsCase(std::vector<FormatCase> formats, std::vector<int> ns, int k, int rows)
      : formats_(std::move(formats)), ns_(std::move(ns)), k_(k), rows_(rows) {}
  std::string name() const override {
    std::string fs, shape;
    for (size_t i = 0; i < ns_.size(); ++i) {
      const char* f = formats_[i % formats_.size()].name;
      if (fs.find(f) == std::string::npos) fs += (fs.empty() ? "" : "+") + std::string(f);
      shape += (i ? "," : "") + std::to_string(ns_[i]);
    }
    return fmt::format("linears {} ({})x{} rows {}", fs, shape, k_, rows_);
  }
  Geometry geometry() const override { return mlp_geometry("linear", 256); }
  void build(std::mt19937_64& rng) override {
    for (size_t i = 0; i < ns_.size(); ++i)
      w_.push_back(random_weight(rng, "w", ns_[i], k_, formats_[i % formats_.size()]));
    x_ = random_values(rng, size_t(rows_) * k_, 1.0f);
  }
  BoundCase bind(Backend& b) const override {
    const Tensor x = act_on_backend(b, x_, rows_, k_);
    auto weights = std::make_shared<std::vector<LinearWeight>>();
    std::vector<LinearOutput> outs;
    for (size_t i = 0; i < ns_.size(); ++i) weights->push_back(on_backend(b, w_[i]));
    for (size_t i = 0; i < ns_.size(); ++i) {
      Tensor out = b.alloc({rows_, ns_[i]}, b.activation_storage_dtype());
      poison(out, 0x7e);  // an element the op leaves unwritten fails the check
      outs.push_back({&(*weights)[i], out});
    }
    Backend* be = &b;
    // The weights live as long as the closures (outs points into them).
    return {[x, outs, be, weights] { be->linears(x, outs); },
            [outs, be] {
              Outputs o;
              for (const LinearOutput& l : outs) o.push_back(read_act(*be, l.out));
              return o;
            }};
  }
  std::vector<Check> checks() const override {
    std::vector<Check> c;
    for (size_t i = 0; i < ns_.size(); ++i) c.push_back(relative_error(fmt::format("out {}", i), i, kTolGemm));
    return c;
  }
  double bytes() const override {
    double b = 2.0 * rows_ * k_;
    for (size_t i = 0; i < ns_.size(); ++i) b += double(w_[i].nbytes()) + 2.0 * rows_ * ns_[i];
    return b;
  }

 private:
  std::vector<FormatCase> formats_;
  std::vector<int> ns_;
  int k_, rows_;
  std::vector<LinearWeight> w_;
  std::vector<float> x_;
};

constexpr int kMlpHidden = 256, kMlpInter = 192;
constexpr float kAlpha = 1.702f, kLimit = 7.0f;

class SwigluCase : public OpCase {
 public:
  SwigluCase(FormatCase f, int rows, int hidden = kMlpHidden, int inter = kMlpInter)
      : f_(f), rows_(rows), hidden_(hidden), inter_(inter) {}
  std::string name() const override {
    const std::string size = hidden_ == kMlpHidden && inter_ == kMlpInter ? "" : fmt::format(" {}x{}", hidden_, inter_);
    return fmt::format("swiglu_mlp {}{} rows {}", f_.name, size, rows_);
  }
  Geometry geometry() const override { return mlp_geometry("mlp", hidden_); }
  void build(std::mt19937_64& rng) override {
    gate_ = random_weight(rng, "gate", inter_, hidden_, f_);
    up_ = random_weight(rng, "up", inter_, hidden_, f_);
    down_ = random_weight(rng, "down", hidden_, inter_, f_);
    x_ = random_values(rng, size_t(rows_) * hidden_, 1.5f);
  }
  BoundCase bind(Backend& b) const override {
    const Tensor x = act_on_backend(b, x_, rows_, hidden_);
    const LinearWeight g = on_backend(b, gate_), u = on_backend(b, up_), d = on_backend(b, down_);
    const Tensor out = b.alloc({rows_, hidden_}, b.activation_storage_dtype());
    Backend* be = &b;
    return {[=] { be->swiglu_mlp(x, g, u, d, kAlpha, kLimit, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
  }
  std::vector<Check> checks() const override { return {relative_error("", 0, kTolGemm)}; }
  double bytes() const override {
    return double(gate_.nbytes() + up_.nbytes() + down_.nbytes()) + 2.0 * 2 * rows_ * hidden_;
  }
  double flops() const override { return 2.0 * rows_ * 3 * inter_ * hidden_; }

 private:
  FormatCase f_;
  int rows_, hidden_, inter_;
  LinearWeight gate_, up_, down_;
  std::vector<float> x_;
};

struct MoeShape {
  const char* name;
  int experts, top_k;
  FormatCase routed, shared;
  int hidden = 256, inter = 128;
};

// The experts one rank holds (expert parallel: [first, first + count) of the shape's) and whether
// the op adds the shared expert (false: the routed-only mode of data-parallel attention).
struct MoeSlice {
  int first = 0;
  int count = 0;  // 0: all of them
  bool add_shared = true;
};

class MoeCase : public OpCase {
 public:
  MoeCase(MoeShape s, int rows, MoeSlice slice = {})
      : s_(s), rows_(rows), slice_(slice), held_(slice.count > 0 ? slice.count : s.experts) {}
  // The one-rank, shared-expert cases keep their names (and so their inputs).
  std::string name() const override {
    const std::string ep =
        held_ == s_.experts ? "" : fmt::format(" ep [{},{})", slice_.first, slice_.first + held_);
    const std::string size = s_.hidden == 256 && s_.inter == 128 ? "" : fmt::format(" {}x{}", s_.hidden, s_.inter);
    return fmt::format("moe {} E{} k{}{}{}{} rows {}", s_.name, s_.experts, s_.top_k, size, ep,
                       slice_.add_shared ? "" : " routed-only", rows_);
  }
  Geometry geometry() const override { return mlp_geometry("moe", s_.hidden); }
  void build(std::mt19937_64& rng) override {
    // Routed only: no shared expert weights at all (the op must not touch them).
    if (slice_.add_shared) {
      mlp_.gate = random_weight(rng, "shared.gate", s_.inter, s_.hidden, s_.shared);
      mlp_.up = random_weight(rng, "shared.up", s_.inter, s_.hidden, s_.shared);
      mlp_.down = random_weight(rng, "shared.down", s_.hidden, s_.inter, s_.shared);
    }
    mlp_.router = random_f32(rng, int64_t(s_.experts) * s_.hidden, 0.08f).reshape({s_.experts, s_.hidden});
    mlp_.router_bias = Tensor::zeros({s_.experts}, DType::kF32);
    for (int e = 0; e < s_.experts; ++e) mlp_.router_bias.data_as<float>()[e] = 0.01f * float(e % 5);
    // Only the held experts' weights exist on this "rank", as the loader leaves them.
    for (int e = 0; e < held_; ++e)
      mlp_.experts.push_back({random_weight(rng, "e.gate", s_.inter, s_.hidden, s_.routed),
                              random_weight(rng, "e.up", s_.inter, s_.hidden, s_.routed),
                              random_weight(rng, "e.down", s_.hidden, s_.inter, s_.routed)});
    x_ = random_values(rng, size_t(rows_) * s_.hidden, 1.0f);
  }
  BoundCase bind(Backend& b) const override {
    const Tensor x = act_on_backend(b, x_, rows_, s_.hidden);
    const MlpWeights mlp = on_backend(b, mlp_);
    Tensor out = b.alloc({rows_, s_.hidden}, b.activation_storage_dtype());
    // Huge values in every element: one the op leaves unwritten fails the check.
    poison(out, 0x7e);
    MoeParams params;
    params.num_experts = s_.experts;
    params.experts_per_token = s_.top_k;
    params.routed_scaling_factor = 2.0f;
    params.first_expert = slice_.first;
    params.add_shared = slice_.add_shared;
    Backend* be = &b;
    return {[=] { be->moe(x, mlp, params, out); }, [=] { return Outputs{{read_act(*be, out)}}; }};
  }
  std::vector<Check> checks() const override { return {relative_error("", 0, kTolGemm)}; }
  double bytes() const override {  // the held experts a step of rows_ tokens can touch, read once
    const double expert = double(mlp_.experts[0].gate.nbytes() * 3);
    const double touched = std::min<double>(held_, double(rows_) * s_.top_k);
    const double shared = double(mlp_.gate.nbytes() + mlp_.up.nbytes() + mlp_.down.nbytes());
    return touched * expert + shared + double(mlp_.router.nbytes()) + 2.0 * 2 * rows_ * s_.hidden;
  }
  double flops() const override {  // the held experts' expected share of the choices
    const double expert_rows = double(rows_) * s_.top_k * held_ / s_.experts + (slice_.add_shared ? rows_ : 0);
    return 2.0 * expert_rows * 3 * s_.inter * s_.hidden;
  }

 private:
  MoeShape s_;
  int rows_;
  MoeSlice slice_;
  int held_;
  MlpWeights mlp_;
  std::vector<float> x_;
};

}  // namespace

void add_linear_cases(CaseList& cases, bool quick) {
  const std::vector<int> row_counts = quick ? std::vector<int>{1, 20, 150} : std::vector<int>{1, 3, 16, 20, 64, 150, 300};
  for (const FormatCase& f : kFormats)
    for (const auto& [n, k] : {std::pair{256, 512}, std::pair{96, 256}, std::pair{40, 96}}) {
      for (int rows : row_counts) cases.push_back(std::make_unique<LinearCase>(f, n, k, rows));
      // A prefill-sized problem: 8 row tiles of the wgmma kernel, several K steps.
      if (!quick && n == 256) cases.push_back(std::make_unique<LinearCase>(f, n, k, 2048));
    }
  // The wgmma kernel's tile edges: a partial last 128-feature weight tile (n 320), a K tail inside
  // the last 64-element step (k 1056, 16.5 steps: the 4-slot stage ring wraps many times; nvfp4
  // and mxfp8 scale rows of 66 and 33 bytes, read byte by byte) and items of 256, 256 and 188 rows
  // (700 rows: N 256 and 192), per tensor-core format.
  if (!quick)
    for (int f : {0, 3, 5, 6, 7}) cases.push_back(std::make_unique<LinearCase>(kFormats[f], 320, 1056, 700));
  // Dense layers wide enough for the wgmma kernel at 33-256 rows (6144 weight rows and more:
  // linear_item_rows): one item of 150 rows (N 192) and one of 100 (N 128), where narrower layers
  // take the streamed kernel.
  if (!quick)
    for (int f : {3, 5, 6, 7}) {
      cases.push_back(std::make_unique<LinearCase>(kFormats[f], 6144, 256, 150));
      cases.push_back(std::make_unique<LinearCase>(kFormats[f], 8192, 128, 100));
    }
  // Split-K over a cluster (wgmma_k_splits): dense layers of 65-256 rows with at least 6144 weight
  // rows in 48 tiles, K of 32 steps and more. 2080 = 32.5 steps: 33 steps split 17 + 16, the last
  // one a K tail; 200 rows: one item of N 256. The SwiGLU pair at 128 rows (gate + up 6144 rows,
  // K 2048) splits its fused gate/up launch.
  if (!quick) {
    for (int f : {0, 5, 7}) {
      cases.push_back(std::make_unique<LinearCase>(kFormats[f], 6144, 2080, 128));
      cases.push_back(std::make_unique<LinearCase>(kFormats[f], 6144, 4096, 200));
    }
    for (int f : {5, 7}) cases.push_back(std::make_unique<SwigluCase>(kFormats[f], 128, 2048, 3072));
  }
  // Dense layers of 33-64 rows as wide (6144 weight rows and more): the wgmma kernel's 64-row size
  // with K split over a cluster (linear_item_rows, wgmma_k_splits); K 2080 = 32.5 steps, a tail
  // in the last split. 32 rows: still the streamed kernel. The SwiGLU pair (gate + up 6144 rows)
  // at 40 rows.
  if (!quick) {
    for (int f : {3, 5, 6, 7})
      for (int rows : {32, 33, 40, 64}) cases.push_back(std::make_unique<LinearCase>(kFormats[f], 6144, 2080, rows));
    for (int f : {5, 7}) cases.push_back(std::make_unique<SwigluCase>(kFormats[f], 40, 2048, 3072));
  }
  // MXFP8 block exponents from about 130 to 139: the exact expansion where a warp's blocks pass
  // 134, the fast one elsewhere (decode rows: skinny and streamed kernels; 300 rows: wgmma).
  for (int rows : quick ? std::vector<int>{20} : std::vector<int>{1, 20, 150, 300})
    cases.push_back(std::make_unique<LinearCase>(kFormats[5], 256, 512, rows, 12));
  // The attention projections' shapes in small: q, k, v, index q, index k (one 40-feature weight
  // ends inside a 16-feature slice, every small one inside a 128-feature wgmma tile), per format;
  // then a mixed group (no fusion). Up to 256 rows the skinny / streamed kernels walk the
  // segments, above (300, 600: a full item and a tail) the wgmma kernel's tiles.
  const std::vector<int> projections = {256, 32, 40, 48, 16};
  for (int rows : quick ? std::vector<int>{1, 20, 300} : std::vector<int>{1, 3, 16, 20, 64, 150, 300, 600}) {
    for (int f : {3, 5, 6, 7, 0}) cases.push_back(std::make_unique<LinearsCase>(std::vector{kFormats[f]}, projections, 256, rows));
    cases.push_back(std::make_unique<LinearsCase>(std::vector{kFormats[5], kFormats[7]}, projections, 256, rows));
  }
  for (const FormatCase& f : kFormats) {
    if (quick && f.format == WeightFormat::kFp8Block) continue;
    // 600 rows: above the skinny kernel's 256-row dense limit, the wgmma kernel's fused SwiGLU.
    for (int rows : {1, 17, 200, 600}) cases.push_back(std::make_unique<SwigluCase>(f, rows));
  }
  const MoeShape shapes[] = {
      {"nvfp4-ct experts, mxfp8 shared", 16, 4, kFormats[7], kFormats[5]},
      {"nvfp4-modelopt experts, bf16 shared", 8, 2, kFormats[6], kFormats[0]},
      {"f32 experts (simt), f32 shared", 8, 2, kFormats[1], kFormats[1]},
  };
  // 200 tokens: experts of ~50 (E16 k4) and ~50 (E8 k2) rows, grouped 64-row items on the wgmma
  // kernel's 64-row size; 300, 1100, 1320 and 2048: items of 320 rows (nvfp4 experts; f32 ones
  // take the SIMT kernel), those of more than 64 rows on the large size, the experts'
  // tails of 17-64 rows on the 64 size and those of up to 16 rows on the streamed kernel (three
  // launches over one item list; 1100 tokens: experts of ~275 rows, one item each; 1320: ~330 rows,
  // an item of 320 and a tail of a few rows).
  for (const MoeShape& s : shapes)
    for (int rows : quick ? std::vector<int>{1, 40, 200} : std::vector<int>{1, 5, 40, 200, 300, 1100, 1320, 2048})
      cases.push_back(std::make_unique<MoeCase>(s, rows));

  // Expert parallel and routed only: each shape's ranks' slices (one of a single expert, fewer
  // than top_k), then the M3.1 routing (128 experts, top-4) at EP 4 (rank 1's [32, 64)). 300
  // tokens take the tensor-core router and, for E8 k2, the wgmma items over gathered rows.
  const MoeShape m3_routing = {"nvfp4-ct experts, mxfp8 shared", 128, 4, kFormats[7], kFormats[5]};
  const std::vector<std::pair<MoeShape, std::vector<MoeSlice>>> ep = {
      {shapes[0], {{0, 4}, {12, 4}, {3, 8}}},
      {shapes[1], {{0, 4}, {4, 4}, {2, 1}}},
      {shapes[2], {{0, 4}, {4, 4}, {2, 1}}},
      {m3_routing, {{32, 32}}},
  };
  // The M3.1 routing at 2,048 tokens (serve's step on smaller GPUs): experts of ~64 rows, all
  // experts and EP 4's rank 1, on the wgmma kernel's 64-row size; at 8,192 (a prefill chunk):
  // experts of ~256 rows, one 320-row item each or an item and a tail.
  if (!quick) {
    cases.push_back(std::make_unique<MoeCase>(m3_routing, 2048));
    cases.push_back(std::make_unique<MoeCase>(m3_routing, 2048, MoeSlice{32, 32, true}));
    cases.push_back(std::make_unique<MoeCase>(m3_routing, 8192));
  }
  for (const auto& [s, slices] : ep)
    for (int rows : quick ? std::vector<int>{7, 300} : std::vector<int>{1, 7, 64, 300}) {
      cases.push_back(std::make_unique<MoeCase>(s, rows, MoeSlice{0, 0, false}));  // all experts, routed only
      for (MoeSlice slice : slices)
        for (bool add_shared : {true, false}) {
          slice.add_shared = add_shared;
          cases.push_back(std::make_unique<MoeCase>(s, rows, slice));
        }
    }

  // The streamed kernel (16-row items of weights whose scale rows are whole 16-byte words): more
  // work units than its persistent CTAs (2 per SM), several stages per unit so the stage ring
  // wraps inside and across units, a K tail shorter than a stage (nvfp4 1280 = 1024 + 256), items
  // of one token tile (1, 5 rows) and of two (9: the second tile mostly absent; 16), the wide
  // form's items of 32 and 64 rows (40, 100 rows; experts of ~19 and ~37 rows at 150 and 300
  // tokens, whose second 32-row chunk is often empty), the fused projections, and an MoE whose
  // gate/up and down both stream.
  // (The large ones in full mode only: the sanitizers run the quick cases, and racecheck takes
  // minutes over thousands of CTAs.)
  if (!quick)
    for (const auto& [f, n, k] : {std::tuple{7, 8192, 3072}, std::tuple{6, 4096, 1280}, std::tuple{5, 4096, 2048},
                                  std::tuple{3, 2048, 1024}})
      for (int rows : {1, 5, 9, 16, 40, 100}) cases.push_back(std::make_unique<LinearCase>(kFormats[f], n, k, rows));
  for (int rows : quick ? std::vector<int>{3} : std::vector<int>{1, 16, 700})
    for (int f : {5, 7})
      cases.push_back(std::make_unique<LinearsCase>(std::vector{kFormats[f]}, std::vector<int>{2048, 256, 256, 512, 128},
                                                    1024, rows));
  // The attention projections as wide as a dense layer that takes the wgmma kernel at 33-256 rows
  // (6,144 + 1,408 weight rows: 59 tiles; at K 2048 a 2-CTA split on 132 SMs), at decode batches
  // of 33 (the 64-row size) and 65-256 rows.
  if (!quick)
    for (int k : {1024, 2048})
      for (int rows : {33, 100, 200})
        for (int f : {5, 7})
          cases.push_back(std::make_unique<LinearsCase>(std::vector{kFormats[f]},
                                                        std::vector<int>{6144, 512, 256, 512, 128}, k, rows));
  MoeShape streamed = {"nvfp4-ct experts, mxfp8 shared", 32, 4, kFormats[7], kFormats[5]};
  streamed.hidden = 1024;
  streamed.inter = 512;
  for (int rows : quick ? std::vector<int>{7, 150} : std::vector<int>{1, 7, 64, 150, 300})
    cases.push_back(std::make_unique<MoeCase>(streamed, rows));

  // Router edges above 256 tokens: hidden 200 ends inside the tensor-core router's 32-element K
  // step; hidden 100 (not a multiple of 8) takes the decode-shaped router and the combine's
  // one-column form.
  for (int hidden : {200, 100}) {
    MoeShape odd = shapes[2];
    odd.hidden = hidden;
    odd.inter = 64;
    cases.push_back(std::make_unique<MoeCase>(odd, 300));
  }

  // A step of more tokens than a grid's y dimension holds (65,535: the combine's token loop; a
  // prefill without chunking), small enough for the CPU reference.
  if (!quick) {
    MoeShape wide = {"nvfp4-ct experts, mxfp8 shared", 4, 2, kFormats[7], kFormats[5]};
    wide.hidden = 64;
    wide.inter = 64;
    cases.push_back(std::make_unique<MoeCase>(wide, 70000));
  }
}

}  // namespace m3::test
