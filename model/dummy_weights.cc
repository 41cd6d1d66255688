// make_dummy_weights: random weights with the shapes and formats a real checkpoint of the config
// would have, for benchmarks without a checkpoint (--load-format dummy); make_dummy_shard: one
// rank's slices of the same weights, built alone (model/dummy_shard.h).
//
// Values are drawn so activations stay sane: every linear dequantizes to roughly N(0, 1/in)
// (std 1/sqrt(in_features)), embeddings N(0, 1), norms ~0 (Gemma (1 + w) ~ 1). Quantized formats
// are filled directly in their encoding (codes drawn from precomputed tables), never by
// quantizing floats.
//
// The seeding scheme: every stored element is a pure function of (seed, tensor name, its flat
// position in the FULL tensor). A tensor's stream is the SplitMix64 sequence from key =
// splitmix64(splitmix64(seed) ^ fnv1a(name)) (".weight" / ".weight_scale" suffixes keep a
// linear's tensors apart), taken counter-style: draw d = splitmix64(key + d * golden gamma), and
// element p is field p % k of draw p / k (k = 8 bytes, 32 two-bit choices or 5 twelve-bit normal
// indices per draw). Any element is therefore reachable without the ones before it: a rank's row
// slice is a run of the full tensor's positions, a column slice one run per row starting
// mid-draw if need be, so no slice bound has to fall on any grid (bf16 columns cut anywhere) and
// the bytes never depend on which other tensors, experts or rows are built. Scales are a constant
// per tensor (fp8, fp8-block, mxfp8) or drawn the same way (nvfp4's group scales).
//
// Generation must be fast for hundreds of GB: all tensors are allocated first (no zero fill but
// the vocabulary padding rows), then one pool of threads fills chunks of about 2^20 elements
// (whole rows); as values depend on positions only, the bytes never depend on the thread count
// or the chunking.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "formats/rows.h"
#include "model/dspark.h"
#include "model/dummy_shard.h"
#include "model/weights.h"

namespace m3 {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Standard normal quantile (Acklam's rational approximation; accuracy is irrelevant here).
double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549671010429940e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  if (p < 0.02425) {
    double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - 0.02425) return -normal_quantile(1 - p);
  double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

constexpr int kNormalBits = 12;

// Tables shared by all fills, built once per call of make_dummy_weights.
struct Tables {
  std::array<float, 1 << kNormalBits> normal{};  // N(0, 1) quantiles
  std::array<uint8_t, 256> fp8_codes{};          // E4M3 codes of N(0, 16) quantiles
  double fp8_rms = 0;
  std::array<uint8_t, 256> nvfp4_pairs{};  // two E2M1 codes of ~N(0, 1.7) per byte
  double nvfp4_rms = 0;
  std::array<uint8_t, 4> nvfp4_scales{};  // E4M3 group scales to pick from
  double nvfp4_scale_rms = 0;

  Tables() {
    for (std::size_t i = 0; i < normal.size(); ++i)
      normal[i] = static_cast<float>(normal_quantile((i + 0.5) / normal.size()));
    double sum = 0;
    for (int i = 0; i < 256; ++i) {
      fp8_codes[i] = fp8_e4m3_encode(static_cast<float>(16 * normal_quantile((i + 0.5) / 256)));
      sum += std::pow(fp8_e4m3_decode(fp8_codes[i]), 2);
    }
    fp8_rms = std::sqrt(sum / 256);
    // 16 quantiles mapped so the largest lands on 6, the top of the E2M1 range.
    uint8_t nibble[16];
    const double top = normal_quantile(15.5 / 16);
    sum = 0;
    for (int i = 0; i < 16; ++i) {
      nibble[i] = e2m1_encode(static_cast<float>(6.0 * normal_quantile((i + 0.5) / 16) / top));
      sum += std::pow(e2m1_decode(nibble[i]), 2);
    }
    nvfp4_rms = std::sqrt(sum / 16);
    for (int b = 0; b < 256; ++b)
      nvfp4_pairs[b] = static_cast<uint8_t>(nibble[b & 15] | (nibble[b >> 4] << 4));
    const float scales[4] = {48, 56, 64, 72};
    sum = 0;
    for (int i = 0; i < 4; ++i) {
      nvfp4_scales[i] = fp8_e4m3_encode(scales[i]);
      sum += scales[i] * scales[i];
    }
    nvfp4_scale_rms = std::sqrt(sum / 4);
  }
};

// Draw d of a tensor's stream: the SplitMix64 sequence from the tensor's key, taken at counter
// d, so any element is reachable without drawing the ones before it.
uint64_t draw(uint64_t key, uint64_t d) { return splitmix64(key + d * 0x9e3779b97f4a7c15ull); }

// Elements [p, p + n) of a tensor's stream of kBits-bit fields (64 / kBits fields per draw, low
// bits first; element p is field p % per of draw p / per): emit(i, field) for i in [0, n).
template <int kBits, class Emit>
void fields(uint64_t key, int64_t p, int64_t n, Emit&& emit) {
  constexpr int kPer = 64 / kBits;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  uint64_t d = static_cast<uint64_t>(p / kPer);
  int64_t i = 0;
  // A run may start mid-draw (a column slice): the rest of that draw first.
  if (const int sub = static_cast<int>(p % kPer); sub != 0 && n > 0) {
    uint64_t r = draw(key, d++) >> (sub * kBits);
    for (int k = sub; k < kPer && i < n; ++k, ++i, r >>= kBits) emit(i, r & kMask);
  }
  // Whole draws, the bulk of every run, without a per-element branch.
  for (; i + kPer <= n; i += kPer) {
    uint64_t r = draw(key, d++);
    for (int k = 0; k < kPer; ++k, r >>= kBits) emit(i + k, r & kMask);
  }
  if (i < n)
    for (uint64_t r = draw(key, d); i < n; ++i, r >>= kBits) emit(i, r & kMask);
}

// The part of one tensor a builder makes, the tensor seen as [rows, cols] storage elements (a 1-D
// tensor is one row): rows [row_begin, row_end) x columns [col_begin, col_end) of the FULL
// tensor, into a row-major destination of dst_rows >= rows() rows whose extra rows are zero
// (vocabulary padding). Positions are the full tensor's, so a slice draws what the whole draws.
struct Region {
  int64_t cols = 0;
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
  int64_t dst_rows = 0;
  int64_t rows() const { return row_end - row_begin; }
  int64_t width() const { return col_end - col_begin; }
};

Region whole_region(int64_t rows, int64_t cols) { return {cols, 0, rows, 0, cols, rows}; }

// One tensor's fill: bytes through a table, normal floats, or a constant.
struct FillJob {
  enum Kind { kByteTable, kByteChoice4, kBf16Normal, kF32Normal, kByteConstant, kF32Constant } kind;
  explicit FillJob(Kind k, float normal_std = 0, float mean_or_value = 0)
      : kind(k), std(normal_std), value(mean_or_value) {}
  float std, value;
  const uint8_t* table = nullptr;        // kByteTable: 256 entries; kByteChoice4: 4 entries
  const uint16_t* bf16_table = nullptr;  // kBf16Normal: bf16(std * normal quantile), 4096 entries
  uint8_t byte = 0;                      // kByteConstant
  void* dst = nullptr;
  Region region;
  uint64_t key = 0;  // the tensor's stream: the seed and the tensor's name

  std::size_t element_bytes() const {
    switch (kind) {
      case kBf16Normal:
        return 2;
      case kF32Normal:
      case kF32Constant:
        return 4;
      default:
        return 1;
    }
  }
};

constexpr int64_t kChunkElements = int64_t{1} << 20;

// Elements [p, p + n) of the full tensor (flat positions) into out.
void fill_run(const FillJob& job, const Tables& t, int64_t p, int64_t n, void* out) {
  switch (job.kind) {
    case FillJob::kByteTable: {
      uint8_t* o = static_cast<uint8_t*>(out);
      fields<8>(job.key, p, n, [&](int64_t i, uint64_t f) { o[i] = job.table[f]; });
      break;
    }
    case FillJob::kByteChoice4: {
      uint8_t* o = static_cast<uint8_t*>(out);
      fields<2>(job.key, p, n, [&](int64_t i, uint64_t f) { o[i] = job.table[f]; });
      break;
    }
    case FillJob::kBf16Normal: {
      uint16_t* o = static_cast<uint16_t*>(out);
      fields<kNormalBits>(job.key, p, n, [&](int64_t i, uint64_t f) { o[i] = job.bf16_table[f]; });
      break;
    }
    case FillJob::kF32Normal: {
      float* o = static_cast<float*>(out);
      fields<kNormalBits>(job.key, p, n,
                          [&](int64_t i, uint64_t f) { o[i] = t.normal[f] * job.std + job.value; });
      break;
    }
    case FillJob::kByteConstant:
      std::memset(out, job.byte, static_cast<std::size_t>(n));
      break;
    case FillJob::kF32Constant:
      std::fill(static_cast<float*>(out), static_cast<float*>(out) + n, job.value);
      break;
  }
}

// Rows [r0, r1) of the job's region (0 is its first row): one run when the region is whole rows.
void fill_rows(const FillJob& job, const Tables& t, int64_t r0, int64_t r1) {
  const Region& g = job.region;
  char* dst = static_cast<char*>(job.dst);
  const std::size_t row_bytes = static_cast<std::size_t>(g.width()) * job.element_bytes();
  if (g.width() == g.cols) {
    fill_run(job, t, (g.row_begin + r0) * g.cols, (r1 - r0) * g.cols, dst + r0 * row_bytes);
    return;
  }
  for (int64_t r = r0; r < r1; ++r)
    fill_run(job, t, (g.row_begin + r) * g.cols + g.col_begin, g.width(), dst + r * row_bytes);
}

// FNV-1a of a tensor's name: its stream, apart from the seed.
uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  return h;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kFp8Block = 128;  // kFp8Block's rows and columns per scale


// What of one [out, in] linear a rank holds: output rows [row_begin, row_end), grown with zero
// rows to out_rows (vocabulary padding), and input columns [col_begin, col_end).
struct Cut {
  int64_t row_begin, row_end, col_begin, col_end, out_rows;
};

Cut whole_cut(int64_t out, int64_t in) { return {0, out, 0, in, out}; }
// Units `s` of `unit` rows each (heads of head_dim rows, intermediate rows of 1).
Cut row_cut(Slice s, int64_t unit, int64_t in) { return {s.begin * unit, s.end() * unit, 0, in, s.size * unit}; }
Cut column_cut(Slice s, int64_t unit, int64_t out) { return {0, out, s.begin * unit, s.end() * unit, out}; }

// The one-rank layout's shard: everything (what make_parallel_layout gives a world of one).
RankShard whole_shard(const ModelConfig& c) {
  RankShard s;
  s.q_heads = {0, c.num_heads};
  s.kv_heads = {0, c.num_kv_heads};
  s.index_heads = {0, c.index_heads};
  s.dense_intermediate = {0, c.dense_intermediate_size};
  s.shared_intermediate = {0, c.shared_intermediate_size};
  s.experts = {0, c.num_experts};
  s.expert_intermediate = {0, c.moe_intermediate_size};
  s.vocab = {0, c.vocab_size};
  return s;
}

// Builds the slices `shard` holds of every tensor (the whole model for whole_shard's shard):
// allocates them all first, then fills them from the pool.
class DummyBuilder {
 public:
  DummyBuilder(const ModelConfig& c, uint64_t seed, const RankShard& shard, unsigned threads, bool whole)
      : c_(c), seed_(splitmix64(seed)), s_(shard), threads_(threads), whole_(whole) {}

  ModelWeights build();
  // A DSpark drafter's weights (the target's config gives the quantization tables only).
  DSparkWeights build_dspark(const DSparkConfig& d);

 private:
  // A tensor of `shape` holding `region` of the full tensor `name`, queued for `job`'s fill.
  Tensor make(const std::string& name, Shape shape, DType dtype, Region region, FillJob job);
  Tensor normal_f32(const std::string& name, Shape shape, float std, float mean = 0) {
    const int64_t n = shape_numel(shape);
    FillJob job(FillJob::kF32Normal, std, mean);
    return make(name, std::move(shape), DType::kF32, whole_region(1, n), job);
  }
  const uint16_t* bf16_table(float std) {
    auto& table = bf16_tables_[std];  // linears of one input width share a table
    if (table.empty()) {
      table.resize(tables_.normal.size());
      for (std::size_t i = 0; i < table.size(); ++i) table[i] = bf16_encode(tables_.normal[i] * std);
    }
    return table.data();
  }
  Tensor embedding();
  LinearWeight linear(const std::string& name, int64_t out, int64_t in, QuantScheme scheme, Cut cut);
  LinearWeight linear(const std::string& name, int64_t out, int64_t in, QuantScheme scheme) {
    return linear(name, out, in, scheme, whole_cut(out, in));
  }
  QuantScheme scheme_for(const std::string& name, QuantScheme declared) const {
    return c_.quant.is_ignored(name) ? QuantScheme::kNone : declared;
  }
  void run_jobs() const;

  const ModelConfig& c_;
  uint64_t seed_;
  const RankShard& s_;
  unsigned threads_;
  bool whole_;
  Tables tables_;
  std::vector<FillJob> jobs_;
  std::map<float, std::vector<uint16_t>> bf16_tables_;  // by std
};

Tensor DummyBuilder::make(const std::string& name, Shape shape, DType dtype, Region g, FillJob job) {
  Tensor t = Tensor::uninitialized(std::move(shape), dtype);
  M3_CHECK(t.numel() == g.dst_rows * g.width() && g.dst_rows >= g.rows() && g.rows() >= 0 && g.width() >= 0,
           "dummy weights: {} {} does not hold rows [{}, {}) x columns [{}, {}) padded to {} rows", name,
           shape_string(t.shape()), g.row_begin, g.row_end, g.col_begin, g.col_end, g.dst_rows);
  const std::size_t row_bytes = static_cast<std::size_t>(g.width()) * dtype_size(dtype);
  // Padding rows are zero: zero codes with zero scales dequantize to 0 in every format.
  if (g.dst_rows > g.rows())
    std::memset(static_cast<char*>(t.data()) + g.rows() * row_bytes, 0, (g.dst_rows - g.rows()) * row_bytes);
  job.dst = t.data();
  job.region = g;
  job.key = splitmix64(seed_ ^ name_hash(name));
  M3_CHECK(job.element_bytes() == dtype_size(dtype), "dummy weights: {}: a fill of {}-byte elements into {}", name,
           job.element_bytes(), dtype_name(dtype));
  if (g.rows() > 0 && g.width() > 0) jobs_.push_back(job);
  return t;
}

// The rank's rows of the padded vocabulary of the bf16 [vocab_size, hidden] table, N(0, 1).
Tensor DummyBuilder::embedding() {
  const int64_t V = c_.vocab_size, H = c_.hidden_size;
  const Slice v = s_.vocab;
  M3_CHECK(v.begin >= 0 && v.size >= 0, "embed_tokens: the rank's vocabulary rows [{}, {}) are not a range", v.begin,
           v.end());
  FillJob job(FillJob::kBf16Normal);
  job.bf16_table = bf16_table(1.0f);
  return make("model.embed_tokens", {v.size, H}, DType::kBF16,
              {H, std::min(v.begin, V), std::min(v.end(), V), 0, H, v.size}, job);
}

LinearWeight DummyBuilder::linear(const std::string& name, int64_t out, int64_t in, QuantScheme scheme, Cut k) {
  LinearWeight w;
  w.name = name;
  w.out_features = k.out_rows;
  w.in_features = k.col_end - k.col_begin;
  const double target = 1.0 / std::sqrt(static_cast<double>(in));
  switch (scheme) {
    case QuantScheme::kNone: w.format = WeightFormat::kDense; break;
    case QuantScheme::kFp8: w.format = WeightFormat::kFp8; break;
    case QuantScheme::kFp8Block: w.format = WeightFormat::kFp8Block; break;
    case QuantScheme::kMxfp8: w.format = WeightFormat::kMxfp8; break;
    case QuantScheme::kNvfp4: w.format = WeightFormat::kNvfp4; break;
  }
  // The slices shard_weights would refuse: out of range, or cutting a scale block.
  M3_CHECK(0 <= k.row_begin && k.row_begin <= k.row_end && k.row_end <= out && k.out_rows >= k.row_end - k.row_begin,
           "{}: the rank's output rows [{}, {}) run past its {} rows", name, k.row_begin, k.row_end, out);
  M3_CHECK(0 <= k.col_begin && k.col_begin <= k.col_end && k.col_end <= in,
           "{}: the rank's input columns [{}, {}) run past its {} columns", name, k.col_begin, k.col_end, in);
  const int64_t block = input_block_columns(w.format);
  for (const int64_t bound : {k.col_begin, k.col_end})
    M3_CHECK(bound % block == 0 || bound == in,
             "{}: column bound {} of [{}, {}) cuts a {} scale block of {} columns (bounds must be multiples of {} or "
             "in_features {})",
             name, bound, k.col_begin, k.col_end, weight_format_name(w.format), block, block, in);
  M3_CHECK(w.format != WeightFormat::kFp8Block ||
               (k.row_begin % kFp8Block == 0 && (k.row_end % kFp8Block == 0 || k.row_end == out)),
           "{}: rows [{}, {}) split a 128-row fp8 scale block", name, k.row_begin, k.row_end);

  const int64_t P = k.out_rows, C = w.in_features;
  // The weight's region in elements of `per` input columns each (nvfp4: two per byte).
  const auto weight_region = [&](int64_t per) {
    return Region{ceil_div(in, per), k.row_begin, k.row_end, k.col_begin / per, ceil_div(k.col_end, per), P};
  };
  FillJob codes(FillJob::kByteTable);
  codes.table = tables_.fp8_codes.data();
  switch (w.format) {
    case WeightFormat::kDense: {
      FillJob job(FillJob::kBf16Normal);
      job.bf16_table = bf16_table(static_cast<float>(target));
      w.weight = make(name + ".weight", {P, C}, DType::kBF16, weight_region(1), job);
      break;
    }
    case WeightFormat::kFp8:
      w.weight = make(name + ".weight", {P, C}, DType::kF8E4M3, weight_region(1), codes);
      w.scale = Tensor::uninitialized({1}, DType::kF32);
      w.scale.data_as<float>()[0] = static_cast<float>(target / tables_.fp8_rms);
      break;
    case WeightFormat::kFp8Block: {
      w.weight = make(name + ".weight", {P, C}, DType::kF8E4M3, weight_region(1), codes);
      const Region g{ceil_div(in, kFp8Block),         k.row_begin / kFp8Block,   ceil_div(k.row_end, kFp8Block),
                     k.col_begin / kFp8Block,         ceil_div(k.col_end, kFp8Block), ceil_div(P, kFp8Block)};
      FillJob job(FillJob::kF32Constant);
      job.value = static_cast<float>(target / tables_.fp8_rms);
      w.scale = make(name + ".weight_scale_inv", {g.dst_rows, g.width()}, DType::kF32, g, job);
      break;
    }
    case WeightFormat::kMxfp8: {
      // One power-of-two scale for every block: 2^round(log2(target / rms)), so the std is
      // within a factor sqrt(2) of the target.
      w.weight = make(name + ".weight", {P, C}, DType::kF8E4M3, weight_region(1), codes);
      const int exponent = static_cast<int>(std::lround(std::log2(target / tables_.fp8_rms)));
      FillJob job(FillJob::kByteConstant);
      job.byte = static_cast<uint8_t>(std::clamp(127 + exponent, 1, 254));
      const Region g = weight_region(kMxfp8Block);
      w.scale = make(name + ".weight_scale", {P, g.width()}, DType::kU8, g, job);
      break;
    }
    case WeightFormat::kNvfp4: {
      FillJob pairs(FillJob::kByteTable);
      pairs.table = tables_.nvfp4_pairs.data();
      const Region g = weight_region(2);
      w.weight = make(name + ".weight", {P, g.width()}, DType::kU8, g, pairs);
      FillJob scales(FillJob::kByteChoice4);
      scales.table = tables_.nvfp4_scales.data();
      const Region gs = weight_region(kNvfp4Group);
      w.scale = make(name + ".weight_scale", {P, gs.width()}, DType::kF8E4M3, gs, scales);
      const double per_unit = tables_.nvfp4_rms * tables_.nvfp4_scale_rms;  // rms of e2m1 * scale
      if (c_.quant.nvfp4_modelopt) {
        w.global_scale = static_cast<float>(target / per_unit);
      } else {
        w.global_divisor = static_cast<float>(per_unit / target);
        w.global_scale = 1.0f / w.global_divisor;
      }
      break;
    }
  }
  return w;
}

void DummyBuilder::run_jobs() const {
  struct Chunk {
    std::size_t job;
    int64_t begin, end;  // rows of the job's region
  };
  std::vector<Chunk> chunks;
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    const Region& g = jobs_[j].region;
    const int64_t rows = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(1, g.width()));
    for (int64_t b = 0; b < g.rows(); b += rows) chunks.push_back({j, b, std::min(g.rows(), b + rows)});
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < chunks.size(); i = next++) fill_rows(jobs_[chunks[i].job], tables_, chunks[i].begin, chunks[i].end);
  };
  const unsigned threads = threads_ > 0 ? threads_ : std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  std::vector<std::jthread> pool;
  for (unsigned t = 1; t < std::min<std::size_t>(threads, chunks.size()); ++t) pool.emplace_back(work);
  work();
}

ModelWeights DummyBuilder::build() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t H = c_.hidden_size, hd = c_.head_dim;
  const QuantScheme lin = c_.quant.linear_scheme, exp = c_.quant.expert_scheme;
  const float norm_noise = 0.02f;
  const RankShard& s = s_;
  ModelWeights w;
  w.embed = embedding();
  w.final_norm = normal_f32("model.norm", {H}, norm_noise);
  if (c_.tie_word_embeddings) {
    w.lm_head.name = "embed_tokens";
    w.lm_head.out_features = s.vocab.size;
    w.lm_head.in_features = H;
    w.lm_head.weight = w.embed;
  } else {
    const int64_t V = c_.vocab_size;
    w.lm_head = linear("lm_head", V, H, QuantScheme::kNone,
                       {std::min(s.vocab.begin, V), std::min(s.vocab.end(), V), 0, H, s.vocab.size});
  }
  w.layers.resize(c_.num_layers);
  for (int i = 0; i < c_.num_layers; ++i) {
    // Release-layout names, as quantization_config's ignore lists spell them (and the streams'
    // keys: a tensor's bytes depend on its name, not on which others are built).
    const std::string L = "language_model.model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.input_norm = normal_f32(L + "input_layernorm", {H}, norm_noise);
    l.post_attn_norm = normal_f32(L + "post_attention_layernorm", {H}, norm_noise);
    const std::string A = L + "self_attn.";
    const int64_t Q = int64_t{c_.num_heads} * hd, KV = int64_t{c_.num_kv_heads} * hd;
    l.attn.q = linear(A + "q_proj", Q, H, scheme_for(A + "q_proj", lin), row_cut(s.q_heads, hd, H));
    l.attn.k = linear(A + "k_proj", KV, H, scheme_for(A + "k_proj", lin), row_cut(s.kv_heads, hd, H));
    l.attn.v = linear(A + "v_proj", KV, H, scheme_for(A + "v_proj", lin), row_cut(s.kv_heads, hd, H));
    l.attn.o = linear(A + "o_proj", H, Q, scheme_for(A + "o_proj", lin), column_cut(s.q_heads, hd, H));
    l.attn.q_norm = normal_f32(A + "q_norm", {hd}, norm_noise);
    l.attn.k_norm = normal_f32(A + "k_norm", {hd}, norm_noise);
    if (c_.attention_kinds[i] == AttentionKind::kSparse) {
      const int64_t ihd = c_.index_head_dim;
      l.attn.index_q = linear(A + "index_q_proj", int64_t{c_.index_heads} * ihd, H, scheme_for(A + "index_q_proj", lin),
                              row_cut(s.index_heads, ihd, H));
      // The one key head every index head shares: whole on every rank.
      l.attn.index_k = linear(A + "index_k_proj", ihd, H, scheme_for(A + "index_k_proj", lin));
      l.attn.index_q_norm = normal_f32(A + "index_q_norm", {ihd}, norm_noise);
      l.attn.index_k_norm = normal_f32(A + "index_k_norm", {ihd}, norm_noise);
    }
    MlpWeights& m = l.mlp;
    if (c_.mlp_kinds[i] == MlpKind::kDense) {
      const int64_t D = c_.dense_intermediate_size;
      const Slice d = s.dense_intermediate;
      m.gate = linear(L + "mlp.gate_proj", D, H, scheme_for(L + "mlp.gate_proj", lin), row_cut(d, 1, H));
      m.up = linear(L + "mlp.up_proj", D, H, scheme_for(L + "mlp.up_proj", lin), row_cut(d, 1, H));
      m.down = linear(L + "mlp.down_proj", H, D, scheme_for(L + "mlp.down_proj", lin), column_cut(d, 1, H));
      continue;
    }
    const std::string M = L + "block_sparse_moe.";
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, S = c_.shared_intermediate_size;
    // Router and bias whole: every rank routes its own tokens.
    m.router = normal_f32(M + "gate", {E, H}, static_cast<float>(1.0 / std::sqrt(static_cast<double>(H))));
    m.router_bias = normal_f32(M + "e_score_correction_bias", {E}, 1e-3f);
    const std::string SE = M + "shared_experts.";
    const Slice sh = s.shared_intermediate;
    m.gate = linear(SE + "gate_proj", S, H, scheme_for(SE + "gate_proj", lin), row_cut(sh, 1, H));
    m.up = linear(SE + "up_proj", S, H, scheme_for(SE + "up_proj", lin), row_cut(sh, 1, H));
    m.down = linear(SE + "down_proj", H, S, scheme_for(SE + "down_proj", lin), column_cut(sh, 1, H));
    // One ignore lookup per layer: ignore lists name experts per layer, not per expert.
    const QuantScheme es = scheme_for(M + "experts.0.w1", exp);
    M3_CHECK(s.experts.begin >= 0 && s.experts.size >= 0 && s.experts.end() <= E,
             "layer {}: the rank's experts [{}, {}) run past num_local_experts {}", i, s.experts.begin, s.experts.end(),
             E);
    // mlp.experts[j] is expert experts.begin + j (with expert parallel whole, else cut by width).
    const Slice x = s.expert_intermediate;
    m.experts.resize(s.experts.size);
    for (int64_t e = s.experts.begin; e < s.experts.end(); ++e) {
      const std::string X = M + "experts." + std::to_string(e) + ".";
      ExpertWeights& ew = m.experts[e - s.experts.begin];
      ew.gate = linear(X + "w1", I, H, es, row_cut(x, 1, H));
      ew.up = linear(X + "w3", I, H, es, row_cut(x, 1, H));
      ew.down = linear(X + "w2", H, I, es, column_cut(x, 1, H));
    }
  }
  run_jobs();
  std::size_t bytes = 0;
  for (const FillJob& j : jobs_) bytes += static_cast<std::size_t>(j.region.rows() * j.region.width()) * j.element_bytes();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  M3_LOG_INFO("dummy weights{}: {} layers, {:.2f} GB in {} tensors, linears {} / experts {}, {:.2f} s ({:.1f} GB/s)",
              whole_ ? std::string() : " of rank " + std::to_string(s.rank), c_.num_layers, bytes / 1e9, jobs_.size(),
              quant_scheme_name(lin), quant_scheme_name(exp), secs, bytes / 1e9 / secs);
  return w;
}

DSparkWeights DummyBuilder::build_dspark(const DSparkConfig& d) {
  const int64_t H = d.hidden_size, hd = d.head_dim, Q = int64_t(d.num_heads) * hd, KV = int64_t(d.num_kv_heads) * hd;
  const QuantScheme mx = QuantScheme::kMxfp8;
  const float norm_noise = 0.02f;
  const std::string p = "language_model.model.dspark.";
  const int taps = static_cast<int>(d.target_layer_ids.size());
  DSparkWeights w;
  const LinearWeight fc = linear(p + "fc", H, int64_t(taps) * H, mx);
  w.hidden_norm = normal_f32(p + "hidden_norm", {H}, norm_noise);
  w.final_norm = normal_f32(p + "norm", {H}, norm_noise);
  for (int l = 0; l < d.num_layers; ++l) {
    const std::string b = p + "layers." + std::to_string(l) + ".";
    DSparkLayerWeights lw;
    lw.input_norm = normal_f32(b + "input_layernorm", {H}, norm_noise);
    lw.post_attn_norm = normal_f32(b + "post_attention_layernorm", {H}, norm_noise);
    lw.q_norm = normal_f32(b + "q_norm", {hd}, norm_noise);
    lw.k_norm = normal_f32(b + "k_norm", {hd}, norm_noise);
    lw.q = linear(b + "q_proj", Q, H, mx);
    lw.k = linear(b + "k_proj", KV, H, mx);
    lw.v = linear(b + "v_proj", KV, H, mx);
    lw.o = linear(b + "o_proj", H, Q, mx);
    lw.gate = linear(b + "gate_proj", d.intermediate_size, H, mx);
    lw.up = linear(b + "up_proj", d.intermediate_size, H, mx);
    lw.down = linear(b + "down_proj", H, d.intermediate_size, mx);
    w.layers.push_back(std::move(lw));
  }
  w.heads.w1 = normal_f32(p + "markov_head.w1", {d.vocab_size, d.markov_rank}, 1.0f);
  w.heads.w2 = normal_f32(p + "markov_head.w2", {d.vocab_size, d.markov_rank}, 0.01f);
  const int64_t conf_in = H + (d.confidence_with_markov ? d.markov_rank : 0);
  w.heads.confidence_w = normal_f32(p + "confidence_head", {conf_in}, 0.01f);
  w.heads.confidence_with_markov = d.confidence_with_markov;
  run_jobs();
  for (int i = 0; i < taps; ++i) w.fc.push_back(taps == 1 ? fc : fc.columns(int64_t(i) * H, int64_t(i + 1) * H));
  return w;
}

}  // namespace

DSparkWeights make_dummy_dspark_weights(const DSparkConfig& config, uint64_t seed) {
  ModelConfig target;  // the builder reads the target's quantization config only: none
  const RankShard everything;
  return DummyBuilder(target, seed, everything, 0, true).build_dspark(config);
}

ModelWeights make_dummy_weights(const ModelConfig& config, uint64_t seed, unsigned threads) {
  const RankShard everything = whole_shard(config);
  return DummyBuilder(config, seed, everything, threads, true).build();
}

ModelWeights make_dummy_shard(const ModelConfig& config, uint64_t seed, const RankShard& shard, unsigned threads) {
  return DummyBuilder(config, seed, shard, threads, false).build();
}

}  // namespace m3
