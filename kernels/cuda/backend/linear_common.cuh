// Work items, weight lookup, the epilogue and the launch dispatch shared by the linear kernels
// (linear.cu: skinny and SIMT kernels; linear_streamed.cu: items of <= 16 rows; linear_wgmma.cu:
// the prefill-shaped wgmma kernel).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {

struct ItemInfo {
  LinearItem item;
  bool valid;
};

__device__ __forceinline__ ItemInfo item_of(const LinearArgs& a, unsigned index) {
  ItemInfo r;
  if (a.items != nullptr) {
    r.valid = int(index) < *a.num_items;
    if (r.valid) r.item = a.items[index];
  } else {
    r.item.expert = 0;
    r.item.row_begin = int(index) * a.item_rows;
    r.item.row_count = min(a.item_rows, a.rows - r.item.row_begin);
    r.valid = r.item.row_count > 0;
  }
  return r;
}

__device__ __forceinline__ WeightView weight_of(const LinearArgs& a, int j, int expert) {
  return a.table[j] != nullptr ? a.table[j][expert] : a.w[j];
}

__device__ __forceinline__ int64_t src_row(const LinearArgs& a, int r) {
  return a.x_rows != nullptr ? a.x_rows[r] : r;
}

// The segment (LinearArgs::seg) that 16-feature slice `slice` of a multi-weight launch falls in.
__device__ __forceinline__ int segment_of(const LinearArgs& a, int slice) {
  int s = 0;
  while (s + 1 < a.num_segments && slice >= a.seg[s + 1].slice_begin) ++s;
  return s;
}

// The same for the wgmma kernel's 128-feature tile `tile`.
__device__ __forceinline__ int segment_of_tile(const LinearArgs& a, int tile) {
  int s = 0;
  while (s + 1 < a.num_segments && tile >= a.seg[s + 1].tile_begin) ++s;
  return s;
}

// One output element from a row's fp32 dot products v (kSwiglu: gate and up) and the weights'
// output factors: stored as it is (kStore) or gate and up combined (kSwiglu).
template <bool kSwiglu>
__device__ __forceinline__ float epilogue_value(const LinearArgs& a, const OutScale* s, const float* v) {
  if constexpr (kSwiglu) {
    const float g = round_bf16(s[0].apply(v[0]));
    const float u = round_bf16(s[1].apply(v[1]));
    return swiglu_oai_bf16(g, u, a.swiglu_alpha, a.swiglu_limit);
  } else {
    return s[0].apply(v[0]);
  }
}

template <bool kSwiglu>
__device__ __forceinline__ float epilogue_value(const LinearArgs& a, const WeightView* w, const float* v) {
  const OutScale s[2] = {OutScale::of(w[0]), kSwiglu ? OutScale::of(w[1]) : OutScale()};
  return epilogue_value<kSwiglu>(a, s, v);
}

// Elements [8 s, 8 s + 8) of a chunk as bf16 pairs: the register-only fast path, or (kExact:
// mxfp8 blocks with an exponent above kMxfp8FastMaxExp) the float path.
template <WeightKind F, bool kExact>
__device__ __forceinline__ uint4 expand_sub(const uint4& raw, int s, const FastScale& sc) {
  if constexpr (kExact) {
    ChunkScale cs;
    cs.mx = ue8m0_decode(uint8_t(mx_exponent_of(sc.pair[0])));
    return decode_sub<F>(raw, s, cs);
  } else {
    return decode_sub_fast<F>(raw, s, sc);
  }
}

// acc += x . b over one sub's 16 K: x0 / x1 the 8 elements of rows g and g + 8 (in the lane's K
// order), b the weights expand_sub gave.
__device__ __forceinline__ void mma_sub(float (&acc)[4], const uint4& x0, const uint4& x1, const uint4& b) {
  const uint32_t a0[4] = {x0.x, x1.x, x0.y, x1.y};
  const uint32_t a1[4] = {x0.z, x1.z, x0.w, x1.w};
  mma_16816<true>(acc, a0, b.x, b.y);
  mma_16816<true>(acc, a1, b.z, b.w);
}

// 16-feature output slices of a launch: those of n, or of every segment (LinearArgs::seg).
inline int linear_slices(const LinearArgs& a) {
  if (a.num_segments == 0) return (a.n + 15) / 16;
  const LinearSegment& last = a.seg[a.num_segments - 1];
  return last.slice_begin + (last.n + 15) / 16;
}

// launch(std::integral_constant<WeightKind, K>()) for the weight kinds the tensor-core kernels
// expand (bf16, fp8, mxfp8, nvfp4); cudaErrorInvalidValue for the others.
template <class Launch>
cudaError_t dispatch_mma_kind(WeightKind kind, Launch&& launch) {
  switch (kind) {
    case WeightKind::kBF16:
      return launch(std::integral_constant<WeightKind, WeightKind::kBF16>());
    case WeightKind::kFp8:
      return launch(std::integral_constant<WeightKind, WeightKind::kFp8>());
    case WeightKind::kMxfp8:
      return launch(std::integral_constant<WeightKind, WeightKind::kMxfp8>());
    case WeightKind::kNvfp4:
      return launch(std::integral_constant<WeightKind, WeightKind::kNvfp4>());
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace m3::cuda::detail
