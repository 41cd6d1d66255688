// LinearWeight views and slices, and exact dequantization (the CPU backend's and the tests' reference).
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t input_block_columns(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFp8Block:
      return kFp8BlockCols;
    case WeightFormat::kMxfp8:
      return kMxfp8Block;
    case WeightFormat::kNvfp4:
      return kNvfp4Group;
    default:
      return 1;
  }
}

namespace {

// Columns [begin, end) of a 2-D host tensor (element columns of its dtype), as an owning copy.
Tensor copy_columns(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), width = t.dim(1);
  const std::size_t element = dtype_size(t.dtype());
  Tensor out = Tensor::zeros({rows, end - begin}, t.dtype());
  const auto* src = static_cast<const char*>(t.data());
  auto* dst = static_cast<char*>(out.data());
  const std::size_t row_bytes = static_cast<std::size_t>(end - begin) * element;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * row_bytes, src + (r * width + begin) * static_cast<int64_t>(element), row_bytes);
  return out;
}

// `t` with `rows` rows along its first dimension, the added ones zero, as an owning copy.
Tensor zero_padded(const Tensor& t, int64_t rows) {
  Shape shape = t.shape();
  shape.at(0) = rows;
  Tensor out = Tensor::zeros(std::move(shape), t.dtype());
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

// A copy that owns its bytes, so a slice outlives the checkpoint's mapping like the rest of it.
Tensor owned_copy(const Tensor& t) {
  Tensor out = Tensor::zeros(t.shape(), t.dtype());
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
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

LinearWeight LinearWeight::columns(int64_t begin, int64_t end) const {
  M3_CHECK(begin >= 0 && begin <= end && end <= in_features,
           "{}: columns [{}, {}) out of range for {} input features", name, begin, end, in_features);
  M3_CHECK(weight.device() == Device::kCpu && weight.ndim() == 2,
           "{}: columns() copies a 2-D host tensor, got {} ({})", name, shape_string(weight.shape()),
           weight.device() == Device::kCpu ? "host" : "on a device");
  // A cut block would need its scale on both sides and every kernel to start mid-block.
  const int64_t block = input_block_columns(format);
  for (const int64_t bound : {begin, end})
    M3_CHECK(bound % block == 0 || bound == in_features,
             "{}: column bound {} of [{}, {}) cuts a {} scale block of {} columns (bounds must be multiples of {} "
             "or in_features {})",
             name, bound, begin, end, weight_format_name(format), block, block, in_features);
  LinearWeight c = *this;
  c.in_features = end - begin;
  switch (format) {
    case WeightFormat::kDense:
      c.weight = copy_columns(weight, begin, end);
      break;
    case WeightFormat::kFp8:
      c.weight = copy_columns(weight, begin, end);
      if (scale.defined()) c.scale = owned_copy(scale);
      break;
    case WeightFormat::kFp8Block:
    case WeightFormat::kMxfp8:
      c.weight = copy_columns(weight, begin, end);
      c.scale = copy_columns(scale, begin / block, ceil_div(end, block));
      break;
    case WeightFormat::kNvfp4:
      // Two E2M1 codes per byte: bounds on 16-column groups are even, so no byte is split; an odd
      // in_features leaves its last high nibble as padding, as stored.
      c.weight = copy_columns(weight, begin / 2, ceil_div(end, 2));
      c.scale = copy_columns(scale, begin / block, ceil_div(end, block));
      break;
  }
  return c;
}

LinearWeight LinearWeight::padded_rows(int64_t rows) const {
  M3_CHECK(rows >= out_features, "{}: cannot pad {} output rows to fewer ({})", name, out_features, rows);
  if (rows == out_features) return *this;
  M3_CHECK(weight.device() == Device::kCpu && weight.ndim() == 2 && weight.dim(0) == out_features,
           "{}: padded_rows() copies a 2-D host tensor of {} rows, got {} ({})", name, out_features,
           shape_string(weight.shape()), weight.device() == Device::kCpu ? "host" : "on a device");
  LinearWeight p = *this;
  p.out_features = rows;
  p.weight = zero_padded(weight, rows);
  switch (format) {
    case WeightFormat::kDense:
      break;
    case WeightFormat::kFp8:
      if (scale.defined()) p.scale = owned_copy(scale);
      break;
    case WeightFormat::kFp8Block:
      // New rows inside the last partial block take its scale; their codes are zero all the same.
      p.scale = zero_padded(scale, ceil_div(rows, kFp8BlockRows));
      break;
    case WeightFormat::kMxfp8:
    case WeightFormat::kNvfp4:
      p.scale = zero_padded(scale, rows);
      break;
  }
  return p;
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
