// The CPU linear layer's building blocks: the AVX2 dequantization against the reference
// dequantize_rows (bit for bit, every code and scale byte), the fused products of few rows against
// the tile path, and the GEMM's batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/cpu_dequant.h"
#include "kernels/cpu/cpu_fused_linear.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/weights.h"

namespace m3 {
namespace {

// Every byte value within each 256 consecutive bytes (for scales), in a scrambled order.
Tensor all_bytes(Shape shape) {
  Tensor t = Tensor::zeros(shape, DType::kU8);
  auto* p = t.data_as<uint8_t>();
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 167);
  return t;
}

Tensor random_bytes(Shape shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::zeros(shape, dtype);
  auto* p = t.data_as<uint8_t>();
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

LinearWeight weight_of(WeightFormat format, int64_t out, int64_t in, std::mt19937& rng) {
  LinearWeight w;
  w.name = "test";
  w.out_features = out;
  w.in_features = in;
  w.format = format;
  switch (format) {
    case WeightFormat::kMxfp8:
      w.weight = random_bytes({out, in}, DType::kU8, rng);
      w.scale = all_bytes({out, (in + 31) / 32});
      break;
    case WeightFormat::kNvfp4:
      w.weight = random_bytes({out, (in + 1) / 2}, DType::kU8, rng);
      w.scale = all_bytes({out, (in + 15) / 16});
      break;
    default:
      w.weight = random_bytes({out, in}, DType::kBF16, rng);
      break;
  }
  return w;
}

// Equal bits, or both NaN (the NaN payload is not part of any format's definition).
void expect_same(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(CpuDequantize, TileEqualsTheReferenceForEveryFormatCodeAndScale) {
  std::mt19937 rng(7);
  struct Case {
    WeightFormat format;
    int64_t in;
    float divisor, global_scale;
  };
  // Widths that are and are not whole blocks; the compressed-tensors divisor and ModelOpt's
  // multiplier (the latter takes the reference path).
  const Case cases[] = {{WeightFormat::kMxfp8, 256, 0, 1},   {WeightFormat::kMxfp8, 77, 0, 1},
                        {WeightFormat::kNvfp4, 256, 0, 1},   {WeightFormat::kNvfp4, 90, 0, 1},
                        {WeightFormat::kNvfp4, 256, 2688.0f, 1.0f / 2688.0f},
                        {WeightFormat::kNvfp4, 48, 0, 0.37f}, {WeightFormat::kDense, 256, 0, 1},
                        {WeightFormat::kDense, 13, 0, 1}};
  for (const Case& c : cases) {
    LinearWeight w = weight_of(c.format, 64, c.in, rng);
    w.global_divisor = c.divisor;
    w.global_scale = c.global_scale;
    std::vector<float> fast(64 * c.in), ref(64 * c.in);
    cpu::dequantize_tile(w, 0, 64, fast.data());
    dequantize_rows(w, 0, 64, ref.data());
    expect_same(fast, ref, std::string(weight_format_name(c.format)) + " in=" + std::to_string(c.in));
    std::vector<float> part(10 * c.in), part_ref(10 * c.in);
    cpu::dequantize_tile(w, 17, 27, part.data());
    dequantize_rows(w, 17, 27, part_ref.data());
    expect_same(part, part_ref, "rows 17-27");
  }
}

// The fused decode-and-multiply of few rows against the tile path (dequantize_tile, then
// gemm_xwt), bit for bit, for every format it takes (every code and scale byte: the scales cycle
// through all 256), and linear() of 1-3 rows (fused) against the same rows inside a batch of 7
// (the tile path).
TEST(CpuFusedLinear, FewRowsEqualTheTilePathBitForBit) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  struct Case {
    WeightFormat format;
    float divisor;
  };
  const Case cases[] = {{WeightFormat::kMxfp8, 0}, {WeightFormat::kNvfp4, 0}, {WeightFormat::kNvfp4, 2688.0f},
                        {WeightFormat::kDense, 0}};
  const int64_t in = 256, out_features = 39;  // not a multiple of 4: the one-row blocks run too
  for (const Case& c : cases) {
    LinearWeight w = weight_of(c.format, out_features, in, rng);
    w.global_divisor = c.divisor;
    if (c.divisor != 0) w.global_scale = 1.0f / c.divisor;
    const std::string what = std::string(weight_format_name(c.format)) + (c.divisor != 0 ? " (divisor)" : "");
    std::vector<float> x(7 * in);
    for (float& v : x) v = normal(rng);
    // NVFP4 with a divisor looks its values up in the tensor's table of divided values.
    std::vector<float> divided;
    if (c.divisor != 0) {
      divided.resize(cpu::kNvfp4DividedValues);
      cpu::nvfp4_divided_table(w, divided.data());
      std::vector<float> sink(40, -1.0f);
      EXPECT_FALSE(cpu::dequant_gemm_tile(x.data(), 1, in, w, 5, 35, sink.data(), 40, nullptr)) << "no table";
    }
    const float* table = divided.empty() ? nullptr : divided.data();
    for (int64_t rows = 1; rows <= cpu::kFusedMaxRows; ++rows) {
      // Weight rows 5..34 of the tile path and of the fused one, output stride 40.
      std::vector<float> tile(30 * in), want(rows * 40, 0.0f), got(rows * 40, 0.0f);
      cpu::dequantize_tile(w, 5, 35, tile.data());
      cpu::gemm_xwt(x.data(), rows, in, tile.data(), 30, in, in, want.data(), 40);
      // Both decoders where the CPU has AVX-512F (NVFP4's takes it), else AVX2's twice.
      for (bool avx512 : {false, true}) {
        std::fill(got.begin(), got.end(), 0.0f);
        ASSERT_TRUE(cpu::dequant_gemm_tile(x.data(), rows, in, w, 5, 35, got.data(), 40, table, avx512)) << what;
        expect_same(got, want, what + " rows " + std::to_string(rows) + (avx512 ? "" : " (AVX2)"));
      }
    }
    cpu::Scratch scratch;
    std::vector<float> batch(7 * out_features);
    cpu::linear(x.data(), 7, w, batch.data(), false, scratch);
    for (int64_t rows = 1; rows <= cpu::kFusedMaxRows; ++rows) {
      std::vector<float> few(rows * out_features);
      cpu::linear(x.data(), rows, w, few.data(), false, scratch);
      expect_same(few, std::vector<float>(batch.begin(), batch.begin() + rows * out_features),
                  what + " linear of " + std::to_string(rows) + " rows");
    }
  }
  // Where it does not apply it says so and writes nothing: more rows, a width off the 32-element
  // grid, ModelOpt's NVFP4 multiplier (the reference path), and above a divisor without its table.
  LinearWeight mx = weight_of(WeightFormat::kMxfp8, 8, 256, rng);
  LinearWeight narrow = weight_of(WeightFormat::kNvfp4, 8, 48, rng);
  LinearWeight modelopt = weight_of(WeightFormat::kNvfp4, 8, 256, rng);
  modelopt.global_scale = 0.37f;
  std::vector<float> x(4 * 256, 1.0f), sink(64, -1.0f);
  EXPECT_FALSE(cpu::dequant_gemm_tile(x.data(), 4, 256, mx, 0, 8, sink.data(), 8, nullptr));
  EXPECT_FALSE(cpu::dequant_gemm_tile(x.data(), 1, 48, narrow, 0, 8, sink.data(), 8, nullptr));
  EXPECT_FALSE(cpu::dequant_gemm_tile(x.data(), 1, 256, modelopt, 0, 8, sink.data(), 8, nullptr));
  for (float v : sink) EXPECT_EQ(v, -1.0f);
}

TEST(CpuGemm, EveryRowIsBitIdenticalWhateverTheBatchAndCloseToExact) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (int64_t k : {7, 64, 100, 384}) {
    const int64_t n = 37, rows = 29;
    std::vector<float> x(rows * k), w(n * k);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng);
    std::vector<float> all(rows * n);
    cpu::gemm_xwt(x.data(), rows, k, w.data(), n, k, k, all.data(), n);
    for (int64_t r = 0; r < rows; ++r) {
      // Alone, and as the last row of a batch of 5 (other rows, other position in the blocking).
      std::vector<float> one(n);
      cpu::gemm_xwt(x.data() + r * k, 1, k, w.data(), n, k, k, one.data(), n);
      ASSERT_EQ(std::memcmp(one.data(), all.data() + r * n, n * 4), 0) << "k " << k << " row " << r;
      if (r >= 4) {
        std::vector<float> five(5 * n);
        cpu::gemm_xwt(x.data() + (r - 4) * k, 5, k, w.data(), n, k, k, five.data(), n);
        ASSERT_EQ(std::memcmp(five.data() + 4 * n, all.data() + r * n, n * 4), 0) << "k " << k << " row " << r;
      }
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0, magnitude = 0;
        for (int64_t i = 0; i < k; ++i) {
          exact += double(x[r * k + i]) * w[j * k + i];
          magnitude += std::fabs(double(x[r * k + i]) * w[j * k + i]);
        }
        EXPECT_NEAR(all[r * n + j], exact, 1e-6 * magnitude + 1e-30) << "k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace m3
