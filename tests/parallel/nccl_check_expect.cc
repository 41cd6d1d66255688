#include "tests/parallel/nccl_check_expect.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "formats/bf16.h"

namespace m3::test {
namespace {

double value_at(DType dtype, const Bytes& bytes, int64_t i) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return bf16_decode(h);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    default: return 0;  // the check program reduces F32, BF16 and I32 only
  }
}

// A bf16 ulp at |v|: 8 significant bits, so 2^(floor(log2 |v|) - 7); below the least normal, its ulp.
double bf16_ulp(double v) {
  int e = 0;
  std::frexp(std::max(std::fabs(v), 0x1p-126), &e);  // |v| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 8);
}

double sum_tolerance(DType dtype, int ranks, double exact, double sum_abs) {
  if (ranks == 1 || dtype == DType::kI32) return 0;
  if (dtype == DType::kBF16 && ranks == 2) return bf16_ulp(exact);
  const double u = dtype == DType::kBF16 ? 0x1p-8 : 0x1p-24;
  return (ranks - 1) * u * sum_abs;
}

}  // namespace

Bytes random_input(DType dtype, int64_t numel, uint64_t seed, int case_id, int rank) {
  std::seed_seq seq{seed, static_cast<uint64_t>(case_id), static_cast<uint64_t>(rank)};
  std::mt19937_64 rng(seq);
  Bytes out(static_cast<std::size_t>(numel) * dtype_size(dtype));
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int32_t> integer(-1000, 1000);
  for (int64_t i = 0; i < numel; ++i) {
    if (dtype == DType::kF32) {
      const float f = real(rng);
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else if (dtype == DType::kBF16) {
      const uint16_t h = bf16_encode(real(rng));
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else if (dtype == DType::kI32) {
      const int32_t v = integer(rng);
      std::memcpy(out.data() + 4 * i, &v, 4);
    }
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kI32) {
    for (auto& b : out) b = static_cast<uint8_t>(rng());
  }
  return out;
}

Verdict check_reduction(DType dtype, ReduceOp op, const std::vector<Bytes>& inputs, int64_t offset, int64_t numel,
                        const Bytes& got) {
  const int ranks = static_cast<int>(inputs.size());
  Verdict v;
  int64_t bad = 0, first_bad = -1;
  double worst_err = 0, worst_tol = 0, first_got = 0, first_want = 0;
  for (int64_t i = 0; i < numel; ++i) {
    double exact = value_at(dtype, inputs[0], offset + i), sum_abs = std::fabs(exact);
    for (int r = 1; r < ranks; ++r) {
      const double x = value_at(dtype, inputs[r], offset + i);
      exact = op == ReduceOp::kMax ? std::max(exact, x) : exact + x;
      sum_abs += std::fabs(x);
    }
    const double tol = op == ReduceOp::kMax ? 0 : sum_tolerance(dtype, ranks, exact, sum_abs);
    const double g = value_at(dtype, got, i);
    const double err = std::fabs(g - exact);
    if (!(err <= tol)) {  // NaN fails too
      if (bad++ == 0) first_bad = i, first_got = g, first_want = exact;
    }
    if (err > worst_err) worst_err = err, worst_tol = tol;
  }
  v.ok = bad == 0;
  v.detail = v.ok ? fmt::format("max err {:.3g} (tol there {:.3g})", worst_err, worst_tol)
                  : fmt::format("{} of {} elements off; first [{}]: got {} want {}", bad, numel, first_bad, first_got,
                                first_want);
  return v;
}

Verdict check_bytes(const Bytes& expected, const Bytes& got) {
  Verdict v;
  if (expected.size() != got.size()) {
    v.ok = false;
    v.detail = fmt::format("{} bytes, {} expected", got.size(), expected.size());
    return v;
  }
  const auto diff = std::mismatch(expected.begin(), expected.end(), got.begin());
  v.ok = diff.first == expected.end();
  v.detail = v.ok ? fmt::format("{} bytes identical", got.size())
                  : fmt::format("byte {} of {} differs: got {:#04x} want {:#04x}", diff.first - expected.begin(),
                                got.size(), *diff.second, *diff.first);
  return v;
}

}  // namespace m3::test
