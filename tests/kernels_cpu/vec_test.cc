// The CPU reference's row primitives (kernels/cpu/cpu_vec.h) and cached-row decoding: the forms
// a CPU with AVX2 runs must give the bits of the portable loops, element by element, so that the
// reference's outputs do not depend on the machine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_vec.h"

namespace m3 {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Values over many binades (sums that round differently in another order), signed zeros.
std::vector<float> random_row(std::mt19937& rng, int n) {
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> x(n);
  for (float& v : x) v = std::ldexp(mantissa(rng), exponent(rng));
  if (n > 3) x[3] = -0.0f;
  return x;
}

TEST(CpuVec, RowFormsEqualThePortableLoopsBitForBit) {
  std::mt19937 rng(20261205);
  for (int n = 0; n <= 200; ++n) {
    for (int trial = 0; trial < 4; ++trial) {
      const std::vector<float> a = random_row(rng, n), b = random_row(rng, n);
      EXPECT_EQ(bits(cpu::dot(a.data(), b.data(), n)), bits(cpu::dot_portable(a.data(), b.data(), n)))
          << "n " << n << " trial " << trial;
      std::vector<std::vector<float>> rows8;
      rows8.reserve(8);
      const float* b8[8];
      for (int j = 0; j < 8; ++j) b8[j] = rows8.emplace_back(random_row(rng, n)).data();
      float out8[8];
      cpu::dot8(a.data(), b8, n, out8);
      for (int j = 0; j < 8; ++j)
        EXPECT_EQ(bits(out8[j]), bits(cpu::dot_portable(a.data(), b8[j], n))) << "dot8 n " << n << " row " << j;
      const float p = random_row(rng, 1)[0];
      std::vector<float> y = random_row(rng, n), y_ref = y;
      cpu::add_scaled(p, a.data(), y.data(), n);
      cpu::add_scaled_portable(p, a.data(), y_ref.data(), n);
      for (int i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(y_ref[i])) << "n " << n << " element " << i;
      const std::vector<float> p8 = random_row(rng, 8);
      cpu::add_scaled8(p8.data(), b8, y.data(), n);
      for (int j = 0; j < 8; ++j) cpu::add_scaled_portable(p8[j], b8[j], y_ref.data(), n);
      for (int i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(y_ref[i])) << "add_scaled8 n " << n << " element " << i;
    }
  }
}

TEST(CpuVec, DotSumsInTheDocumentedLaneOrder) {
  // l0 = 1, l2 = 1e30, l6 = -1e30: ((l0 + l4) + (l2 + l6)) + ... keeps the 1; a running sum
  // (1 + 1e30 - 1e30) or adjacent pairs ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) lose it.
  std::vector<float> a(8, 0.0f), b(8, 1.0f);
  a[0] = 1.0f;
  a[2] = 1e30f;
  a[6] = -1e30f;
  EXPECT_EQ(cpu::dot(a.data(), b.data(), 8), 1.0f);
  EXPECT_EQ(cpu::dot_portable(a.data(), b.data(), 8), 1.0f);
}

TEST(CpuKvDecodeRow, EveryDtypeGivesTheScalarDecodeOfEachElement) {
  std::mt19937 rng(7);
  for (const int dim : {16, 64, 128, 176}) {
    const std::vector<float> x = random_row(rng, dim);
    std::vector<float> out(dim);
    // bf16
    std::vector<uint8_t> data(size_t(dim) * 4), scales(dim / 16);
    for (int i = 0; i < dim; ++i) {
      const uint16_t h = bf16_encode(x[i]);
      std::memcpy(data.data() + 2 * i, &h, 2);
    }
    cpu_kv_decode_row(KvDType::kBF16, data.data(), nullptr, dim, false, out.data());
    for (int i = 0; i < dim; ++i) ASSERT_EQ(bits(out[i]), bits(bf16_round(x[i]))) << "bf16 dim " << dim << " i " << i;
    // fp8, including every byte (the NaN codes too)
    for (int i = 0; i < dim; ++i) data[i] = static_cast<uint8_t>((i * 37 + dim) & 0xff);
    cpu_kv_decode_row(KvDType::kFP8, data.data(), nullptr, dim, false, out.data());
    for (int i = 0; i < dim; ++i)
      ASSERT_EQ(bits(out[i]), bits(fp8_e4m3_decode(data[i]))) << "fp8 dim " << dim << " i " << i;
    // nvfp4, both views, every code under random and extreme scales
    for (int g = 0; g < dim / 16; ++g) nvfp4_kv_encode_group(x.data() + 16 * g, data.data() + 8 * g, &scales[g]);
    scales[0] = 0x7e;  // the largest finite E4M3 scale
    for (int i = 0; i < 8; ++i) data[i] = static_cast<uint8_t>(2 * i | (2 * i + 1) << 4);  // codes 0..15
    for (const bool e4m3_view : {false, true}) {
      cpu_kv_decode_row(KvDType::kNVFP4, data.data(), scales.data(), dim, e4m3_view, out.data());
      for (int i = 0; i < dim; ++i) {
        const uint8_t code = nvfp4_code_at(data.data(), i), scale = scales[i / 16];
        const float want = e4m3_view ? nvfp4_value_e4m3(code, scale) : nvfp4_value(code, scale);
        ASSERT_EQ(bits(out[i]), bits(want)) << "nvfp4 dim " << dim << " i " << i << " view " << e4m3_view;
      }
    }
  }
}

}  // namespace
}  // namespace m3
