// LinearWeight views and exact dequantization (the CPU backend's and the tests' reference).
#include <cstring>

#include "core/error.h"
#include "formats/rows.h"
#include "ops/weights.h"

namespace m3 {

namespace {
constexpr int64_t kFp8BlockRows = 128;
constexpr int64_t kFp8BlockCols = 128;

float scalar_f32(const Tensor& t) {
  if (!t.defined()) return 1.0f;
  float v;
  std::memcpy(&v, t.data(), sizeof v);
  return v;
}
}  // namespace

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kDense:
      return "dense";
    case WeightFormat::kFp8:
      return "fp8";
    case WeightFormat::kFp8Block:
      return "fp8-block128";
    case WeightFormat::kMxfp8:
      return "mxfp8";
    case WeightFormat::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

LinearWeight LinearWeight::rows(int64_t begin, int64_t end) const {
  M3_CHECK(begin >= 0 && begin <= end && end <= out_features,
           "{}: rows [{}, {}) out of range for {} output features", name, begin, end, out_features);
  LinearWeight r = *this;
  r.out_features = end - begin;
  r.weight = weight.rows(begin, end);
  switch (format) {
    case WeightFormat::kDense:
    case WeightFormat::kFp8:
      break;
    case WeightFormat::kMxfp8:
    case WeightFormat::kNvfp4:
      r.scale = scale.rows(begin, end);
      break;
    case WeightFormat::kFp8Block:
      M3_CHECK(begin % kFp8BlockRows == 0 && (end % kFp8BlockRows == 0 || end == out_features),
               "{}: rows [{}, {}) split a 128-row fp8 scale block", name, begin, end);
      r.scale = scale.rows(begin / kFp8BlockRows, (end + kFp8BlockRows - 1) / kFp8BlockRows);
      break;
  }
  return r;
}

std::size_t LinearWeight::nbytes() const {
  return (weight.defined() ? weight.nbytes() : 0) + (scale.defined() ? scale.nbytes() : 0);
}

int64_t linear_weight_bytes(WeightFormat format, int64_t out, int64_t in, int dense_element_bytes) {
  switch (format) {
    case WeightFormat::kDense:
      return out * in * dense_element_bytes;
    case WeightFormat::kFp8:
      return out * in + 4;  // one F32 scale
    case WeightFormat::kFp8Block:
      return out * in + 4 * ((out + kFp8BlockRows - 1) / kFp8BlockRows) * ((in + kFp8BlockCols - 1) / kFp8BlockCols);
    case WeightFormat::kMxfp8:
      return out * in + out * ((in + kMxfp8Block - 1) / kMxfp8Block);
    case WeightFormat::kNvfp4:
      return out * ((in + 1) / 2) + out * ((in + kNvfp4Group - 1) / kNvfp4Group);
  }
  return 0;
}

void dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
  M3_CHECK(row_begin >= 0 && row_begin <= row_end && row_end <= w.out_features,
           "{}: dequantize rows [{}, {}) out of range for {} output features", w.name, row_begin,
           row_end, w.out_features);
  M3_CHECK(w.weight.device() == Device::kCpu, "{}: dequantize_rows needs a host tensor", w.name);
  const int64_t in = w.in_features;
  const int64_t stride = w.weight.ndim() >= 2 ? w.weight.dim(-1) : in;
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* dst = out + (r - row_begin) * in;
    switch (w.format) {
      case WeightFormat::kDense: {
        const DType dt = w.weight.dtype();
        if (dt == DType::kF32) {
          std::memcpy(dst, w.weight.data_as<const float>() + r * stride, in * sizeof(float));
        } else if (dt == DType::kBF16) {
          bf16_to_f32(w.weight.data_as<const uint16_t>() + r * stride, dst, in);
        } else if (dt == DType::kF16) {
          fp16_to_f32(w.weight.data_as<const uint16_t>() + r * stride, dst, in);
        } else {
          fail("{}: dense weight of dtype {} cannot be dequantized", w.name, dtype_name(dt));
        }
        break;
      }
      case WeightFormat::kFp8:
        fp8_e4m3_to_f32(w.weight.data_as<const uint8_t>() + r * stride, dst, in,
                        scalar_f32(w.scale));
        break;
      case WeightFormat::kFp8Block: {
        const uint8_t* codes = w.weight.data_as<const uint8_t>() + r * stride;
        const int64_t scale_cols = w.scale.dim(1);
        const float* scale_row = w.scale.data_as<const float>() + (r / kFp8BlockRows) * scale_cols;
        const auto& table = fp8_e4m3_table();
        for (int64_t c = 0; c < in; ++c) dst[c] = table[codes[c]] * scale_row[c / kFp8BlockCols];
        break;
      }
      case WeightFormat::kMxfp8:
        mxfp8_row_to_f32(w.weight.data_as<const uint8_t>() + r * stride,
                         w.scale.data_as<const uint8_t>() + r * w.scale.dim(1), in, dst);
        break;
      case WeightFormat::kNvfp4: {
        const bool divides = w.global_divisor != 0.0f;
        nvfp4_row_to_f32(w.weight.data_as<const uint8_t>() + r * stride,
                         w.scale.data_as<const uint8_t>() + r * w.scale.dim(1), in, dst,
                         divides ? w.global_divisor : 1.0f);
        if (!divides && w.global_scale != 1.0f) {
          for (int64_t c = 0; c < in; ++c) dst[c] *= w.global_scale;
        }
        break;
      }
    }
  }
}

}  // namespace m3
