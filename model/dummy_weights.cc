// make_dummy_weights: random weights with the shapes and formats a real checkpoint of the config
// would have, for benchmarks without a checkpoint (--load-format dummy).
//
// Values are drawn so activations stay sane: every linear dequantizes to roughly N(0, 1/in)
// (std 1/sqrt(in_features)), embeddings N(0, 1), norms ~0 (Gemma (1 + w) ~ 1). Generation must be
// fast for hundreds of GB: all tensors are allocated first (no zero fill), then one pool of
// threads fills fixed-size chunks, each from its own counter-seeded xorshift stream, so the bytes
// depend only on the seed, never on the thread count. Quantized formats are filled directly in
// their encoding (codes drawn from precomputed tables), never by quantizing floats.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "formats/rows.h"
#include "model/weights.h"

namespace m3 {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Xorshift {
  uint64_t s;
  explicit Xorshift(uint64_t seed) : s(splitmix64(seed) | 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  }
};

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

// One tensor's fill: bytes through a 256-entry table, or normal floats.
struct FillJob {
  enum Kind { kByteTable, kByteChoice4, kBf16Normal, kF32Normal, kF32Constant } kind;
  void* dst;
  int64_t count;  // elements
  float std = 0, value = 0;
  const uint8_t* table = nullptr;        // kByteTable: 256 entries; kByteChoice4: 4 entries
  const uint16_t* bf16_table = nullptr;  // kBf16Normal: bf16(std * normal quantile), 4096 entries
  uint64_t seed = 0;
};

constexpr int64_t kChunkElements = int64_t{1} << 20;

void fill_chunk(const FillJob& job, const Tables& t, int64_t begin, int64_t end, uint64_t seed) {
  Xorshift rng(seed);
  switch (job.kind) {
    case FillJob::kByteTable: {
      uint8_t* out = static_cast<uint8_t*>(job.dst);
      int64_t i = begin;
      for (; i + 8 <= end; i += 8) {
        uint64_t r = rng.next();
        for (int k = 0; k < 8; ++k) out[i + k] = job.table[(r >> (8 * k)) & 0xff];
      }
      for (uint64_t r = rng.next(); i < end; ++i, r >>= 8) out[i] = job.table[r & 0xff];
      break;
    }
    case FillJob::kByteChoice4: {
      uint8_t* out = static_cast<uint8_t*>(job.dst);
      for (int64_t i = begin; i < end;) {
        uint64_t r = rng.next();
        for (int k = 0; k < 32 && i < end; ++k, ++i, r >>= 2) out[i] = job.table[r & 3];
      }
      break;
    }
    case FillJob::kBf16Normal: {
      uint16_t* out = static_cast<uint16_t*>(job.dst);
      const uint64_t mask = (uint64_t{1} << kNormalBits) - 1;
      for (int64_t i = begin; i < end;) {
        uint64_t r = rng.next();
        for (int k = 0; k < 64 / kNormalBits && i < end; ++k, ++i, r >>= kNormalBits)
          out[i] = job.bf16_table[r & mask];
      }
      break;
    }
    case FillJob::kF32Normal: {
      float* out = static_cast<float*>(job.dst);
      const uint64_t mask = (uint64_t{1} << kNormalBits) - 1;
      for (int64_t i = begin; i < end;) {
        uint64_t r = rng.next();
        for (int k = 0; k < 64 / kNormalBits && i < end; ++k, ++i, r >>= kNormalBits)
          out[i] = t.normal[r & mask] * job.std + job.value;
      }
      break;
    }
    case FillJob::kF32Constant:
      std::fill(static_cast<float*>(job.dst) + begin, static_cast<float*>(job.dst) + end,
                job.value);
      break;
  }
}

// Host memory without the zero fill of Tensor::zeros (the fill threads touch it first);
// 2 MiB-aligned and huge-page advised when large.
Tensor uninitialized(Shape shape, DType dtype) {
  std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  const std::size_t align = bytes >= (std::size_t{2} << 20) ? (std::size_t{2} << 20) : 64;
  std::size_t rounded = std::max<std::size_t>((bytes + align - 1) / align * align, align);
  void* p = std::aligned_alloc(align, rounded);
  M3_CHECK(p != nullptr, "out of host memory allocating {} bytes for dummy weights", bytes);
#ifdef MADV_HUGEPAGE
  if (align > 64) ::madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return Tensor::wrap(p, std::move(shape), dtype, Device::kCpu,
                      std::shared_ptr<void>(p, std::free));
}

class DummyBuilder {
 public:
  DummyBuilder(const ModelConfig& c, uint64_t seed) : c_(c), seed_(seed) {}

  ModelWeights build();

 private:
  void add_job(FillJob job) {
    job.seed = splitmix64(seed_ ^ splitmix64(jobs_.size() + 1));
    jobs_.push_back(job);
  }
  Tensor normal_f32(Shape shape, float std, float mean = 0) {
    Tensor t = uninitialized(std::move(shape), DType::kF32);
    add_job({FillJob::kF32Normal, t.data(), t.numel(), std, mean});
    return t;
  }
  Tensor normal_bf16(Shape shape, float std) {
    Tensor t = uninitialized(std::move(shape), DType::kBF16);
    FillJob job{FillJob::kBf16Normal, t.data(), t.numel(), std};
    auto& table = bf16_tables_[std];  // linears of one input width share a table
    if (table.empty()) {
      table.resize(tables_.normal.size());
      for (std::size_t i = 0; i < table.size(); ++i)
        table[i] = bf16_encode(tables_.normal[i] * std);
    }
    job.bf16_table = table.data();
    add_job(job);
    return t;
  }
  Tensor bytes(Shape shape, DType dtype, const uint8_t* table,
               FillJob::Kind kind = FillJob::kByteTable) {
    Tensor t = uninitialized(std::move(shape), dtype);
    FillJob job{kind, t.data(), t.numel()};
    job.table = table;
    add_job(job);
    return t;
  }
  LinearWeight linear(const std::string& name, int64_t out, int64_t in, QuantScheme scheme);
  QuantScheme scheme_for(const std::string& name, QuantScheme declared) const {
    return c_.quant.is_ignored(name) ? QuantScheme::kNone : declared;
  }
  void run_jobs() const;

  const ModelConfig& c_;
  uint64_t seed_;
  Tables tables_;
  std::vector<FillJob> jobs_;
  std::array<std::unique_ptr<std::array<uint8_t, 256>>, 256> constant_tables_;  // by value
  std::map<float, std::vector<uint16_t>> bf16_tables_;                          // by std

  const uint8_t* constant_table(uint8_t value) {
    auto& t = constant_tables_[value];
    if (!t) {
      t = std::make_unique<std::array<uint8_t, 256>>();
      t->fill(value);
    }
    return t->data();
  }
};

LinearWeight DummyBuilder::linear(const std::string& name, int64_t out, int64_t in,
                                  QuantScheme scheme) {
  LinearWeight w;
  w.name = name;
  w.out_features = out;
  w.in_features = in;
  const double target = 1.0 / std::sqrt(static_cast<double>(in));
  switch (scheme) {
    case QuantScheme::kNone:
      w.format = WeightFormat::kDense;
      w.weight = normal_bf16({out, in}, static_cast<float>(target));
      break;
    case QuantScheme::kFp8:
      w.format = WeightFormat::kFp8;
      w.weight = bytes({out, in}, DType::kF8E4M3, tables_.fp8_codes.data());
      w.scale = uninitialized({1}, DType::kF32);
      w.scale.data_as<float>()[0] = static_cast<float>(target / tables_.fp8_rms);
      break;
    case QuantScheme::kFp8Block: {
      w.format = WeightFormat::kFp8Block;
      w.weight = bytes({out, in}, DType::kF8E4M3, tables_.fp8_codes.data());
      w.scale = uninitialized({(out + 127) / 128, (in + 127) / 128}, DType::kF32);
      FillJob job{FillJob::kF32Constant, w.scale.data(), w.scale.numel()};
      job.value = static_cast<float>(target / tables_.fp8_rms);
      add_job(job);
      break;
    }
    case QuantScheme::kMxfp8: {
      // One power-of-two scale for every block: 2^round(log2(target / rms)), so the std is
      // within a factor sqrt(2) of the target.
      w.format = WeightFormat::kMxfp8;
      w.weight = bytes({out, in}, DType::kF8E4M3, tables_.fp8_codes.data());
      const int exponent = static_cast<int>(std::lround(std::log2(target / tables_.fp8_rms)));
      const uint8_t s = static_cast<uint8_t>(std::clamp(127 + exponent, 1, 254));
      w.scale = bytes({out, (in + kMxfp8Block - 1) / kMxfp8Block}, DType::kU8, constant_table(s));
      break;
    }
    case QuantScheme::kNvfp4: {
      w.format = WeightFormat::kNvfp4;
      w.weight = bytes({out, (in + 1) / 2}, DType::kU8, tables_.nvfp4_pairs.data());
      w.scale = bytes({out, (in + kNvfp4Group - 1) / kNvfp4Group}, DType::kF8E4M3,
                      tables_.nvfp4_scales.data(), FillJob::kByteChoice4);
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
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (std::size_t j = 0; j < jobs_.size(); ++j)
    for (int64_t b = 0; b < jobs_[j].count; b += kChunkElements)
      chunks.push_back({j, b, std::min(jobs_[j].count, b + kChunkElements)});
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < chunks.size(); i = next++) {
      const Chunk& ch = chunks[i];
      const FillJob& job = jobs_[ch.job];
      fill_chunk(job, tables_, ch.begin, ch.end,
                 job.seed ^ splitmix64(static_cast<uint64_t>(ch.begin)));
    }
  };
  const unsigned threads = std::max(1u, std::min(std::thread::hardware_concurrency(), 64u));
  std::vector<std::jthread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
}

ModelWeights DummyBuilder::build() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t H = c_.hidden_size, hd = c_.head_dim;
  const QuantScheme lin = c_.quant.linear_scheme, exp = c_.quant.expert_scheme;
  const float norm_noise = 0.02f;
  ModelWeights w;
  w.embed = normal_bf16({c_.vocab_size, H}, 1.0f);
  w.final_norm = normal_f32({H}, norm_noise);
  if (c_.tie_word_embeddings) {
    w.lm_head.name = "embed_tokens";
    w.lm_head.out_features = c_.vocab_size;
    w.lm_head.in_features = H;
    w.lm_head.weight = w.embed;
  } else {
    w.lm_head = linear("lm_head", c_.vocab_size, H, QuantScheme::kNone);
  }
  w.layers.resize(c_.num_layers);
  for (int i = 0; i < c_.num_layers; ++i) {
    // Release-layout names, as quantization_config's ignore lists spell them.
    const std::string L = "language_model.model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.input_norm = normal_f32({H}, norm_noise);
    l.post_attn_norm = normal_f32({H}, norm_noise);
    const std::string A = L + "self_attn.";
    l.attn.q = linear(A + "q_proj", c_.num_heads * hd, H, scheme_for(A + "q_proj", lin));
    l.attn.k = linear(A + "k_proj", c_.num_kv_heads * hd, H, scheme_for(A + "k_proj", lin));
    l.attn.v = linear(A + "v_proj", c_.num_kv_heads * hd, H, scheme_for(A + "v_proj", lin));
    l.attn.o = linear(A + "o_proj", H, c_.num_heads * hd, scheme_for(A + "o_proj", lin));
    l.attn.q_norm = normal_f32({hd}, norm_noise);
    l.attn.k_norm = normal_f32({hd}, norm_noise);
    if (c_.attention_kinds[i] == AttentionKind::kSparse) {
      const int64_t ihd = c_.index_head_dim;
      l.attn.index_q =
          linear(A + "index_q_proj", c_.index_heads * ihd, H, scheme_for(A + "index_q_proj", lin));
      l.attn.index_k = linear(A + "index_k_proj", ihd, H, scheme_for(A + "index_k_proj", lin));
      l.attn.index_q_norm = normal_f32({ihd}, norm_noise);
      l.attn.index_k_norm = normal_f32({ihd}, norm_noise);
    }
    MlpWeights& m = l.mlp;
    if (c_.mlp_kinds[i] == MlpKind::kDense) {
      const int64_t D = c_.dense_intermediate_size;
      m.gate = linear(L + "mlp.gate_proj", D, H, scheme_for(L + "mlp.gate_proj", lin));
      m.up = linear(L + "mlp.up_proj", D, H, scheme_for(L + "mlp.up_proj", lin));
      m.down = linear(L + "mlp.down_proj", H, D, scheme_for(L + "mlp.down_proj", lin));
      continue;
    }
    const std::string M = L + "block_sparse_moe.";
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, S = c_.shared_intermediate_size;
    m.router = normal_f32({E, H}, static_cast<float>(1.0 / std::sqrt(static_cast<double>(H))));
    m.router_bias = normal_f32({E}, 1e-3f);
    const std::string SE = M + "shared_experts.";
    m.gate = linear(SE + "gate_proj", S, H, scheme_for(SE + "gate_proj", lin));
    m.up = linear(SE + "up_proj", S, H, scheme_for(SE + "up_proj", lin));
    m.down = linear(SE + "down_proj", H, S, scheme_for(SE + "down_proj", lin));
    // One ignore lookup per layer: ignore lists name experts per layer, not per expert.
    const QuantScheme es = scheme_for(M + "experts.0.w1", exp);
    m.experts.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      const std::string X = M + "experts." + std::to_string(e) + ".";
      m.experts[e].gate = linear(X + "w1", I, H, es);
      m.experts[e].up = linear(X + "w3", I, H, es);
      m.experts[e].down = linear(X + "w2", H, I, es);
    }
  }
  run_jobs();
  std::size_t bytes = 0;
  for (const FillJob& j : jobs_) {
    switch (j.kind) {
      case FillJob::kByteTable:
      case FillJob::kByteChoice4:
        bytes += j.count;
        break;
      case FillJob::kBf16Normal:
        bytes += 2 * j.count;
        break;
      default:
        bytes += 4 * j.count;
        break;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  M3_LOG_INFO(
      "dummy weights: {} layers, {:.2f} GB in {} tensors, linears {} / experts {}, {:.2f} s "
      "({:.1f} GB/s)",
      c_.num_layers, bytes / 1e9, jobs_.size(), quant_scheme_name(lin), quant_scheme_name(exp), s,
      bytes / 1e9 / s);
  return w;
}

}  // namespace

ModelWeights make_dummy_weights(const ModelConfig& config, uint64_t seed) {
  return DummyBuilder(config, seed).build();
}

}  // namespace m3
