// Work items, weight lookup and the epilogue shared by the linear kernels (linear.cu: skinny and
// SIMT kernels; linear_wgmma.cu: the prefill-shaped wgmma kernel).
#pragma once
#include <cstdint>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"

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

// Stores one output element (kStore) or combines gate and up (kSwiglu).
template <bool kSwiglu>
__device__ __forceinline__ float epilogue_value(const LinearArgs& a, const WeightView* w, const float* v) {
  if constexpr (kSwiglu) {
    const float g = round_bf16(apply_out_scale(w[0], v[0]));
    const float u = round_bf16(apply_out_scale(w[1], v[1]));
    return swiglu_oai_bf16(g, u, a.swiglu_alpha, a.swiglu_limit);
  } else {
    return apply_out_scale(w[0], v[0]);
  }
}

}  // namespace m3::cuda::detail
