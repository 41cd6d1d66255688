// The merge of one (row, KV head)'s split attention partials (CombineWork): the partials' running
// maxima to one, each unnormalised O and normaliser rescaled to it and summed in split order, then
// the bf16 output and the LSE. combine_kernel (attention.cu) runs it one CTA an item; the sparse
// rows kernel (sparse_rows.cu) runs it in the last CTA of a row's splits to finish, one launch
// less a layer. Same arithmetic either way, so the output is the same bits.
#pragma once
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/msa_kernels.h"

namespace m3::cuda::detail {

// Every thread of the CTA calls it. kFromPeers (the sparse rows kernel): other CTAs of the same
// launch wrote the partials, so they are read through L2 (ld.global.cg), never a stale L1 line.
template <bool kFromPeers>
__device__ __forceinline__ float load_partial(const float* p) {
  return kFromPeers ? __ldcg(p) : *p;
}
template <bool kFromPeers>
__device__ __forceinline__ float4 load_partial4(const float4* p) {
  return kFromPeers ? __ldcg(p) : *p;
}

// A query head's merged dims d0 .. d0 + 15 as bf16 (acc / l) and, from the thread of d0 = 0, its
// natural-log LSE (m in raw dot units; nvfp4 sums carry the 448 of the probability path).
__device__ __forceinline__ void store_merged(uint16_t* out, float* lse, int64_t head, int d0, const float (&acc)[16],
                                             float m, float l, float sm_scale, bool nvfp4) {
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  uint32_t packed[8];
#pragma unroll
  for (int d = 0; d < 8; ++d) packed[d] = pack2<true>(acc[2 * d] * inv, acc[2 * d + 1] * inv);
  uint4* dst = reinterpret_cast<uint4*>(out + head * kDim + d0);
  dst[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  dst[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  if (lse && d0 == 0) lse[head] = l > 0.0f ? m * sm_scale + logf(l) - (nvfp4 ? kLn448 : 0.0f) : -INFINITY;
}

template <bool kFromPeers>
__device__ __forceinline__ void combine_splits(const CombineArgs& a, const CombineWork& w) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const float c2 = a.sm_scale * kLog2e;
  for (int item = threadIdx.x; item < group * 8; item += blockDim.x) {
    const int r = item >> 3, d0 = (item & 7) * 16;
    float m = -INFINITY;
    for (int s = 0; s < w.num_splits; ++s)
      m = fmaxf(m, load_partial<kFromPeers>(a.partial_ml + (int64_t(w.partial_begin + s) * kMaxGroup + r) * 2));
    float l = 0.0f, acc[16];
#pragma unroll
    for (int d = 0; d < 16; ++d) acc[d] = 0.0f;
    for (int s = 0; s < w.num_splits; ++s) {
      const int64_t p = w.partial_begin + s;
      const float ms = load_partial<kFromPeers>(a.partial_ml + (p * kMaxGroup + r) * 2);
      const float e = ms == -INFINITY ? 0.0f : ex2_approx((ms - m) * c2);
      l += e * load_partial<kFromPeers>(a.partial_ml + (p * kMaxGroup + r) * 2 + 1);
      const float4* src = reinterpret_cast<const float4*>(a.partial_o + (p * kMaxGroup + r) * kDim + d0);
#pragma unroll
      for (int d = 0; d < 4; ++d) {
        const float4 v = load_partial4<kFromPeers>(src + d);
        acc[4 * d] += e * v.x;
        acc[4 * d + 1] += e * v.y;
        acc[4 * d + 2] += e * v.z;
        acc[4 * d + 3] += e * v.w;
      }
    }
    store_merged(a.out, a.lse, int64_t(w.row) * a.num_q_heads + w.kv_head * group + r, d0, acc, m, l, a.sm_scale,
                 a.nvfp4);
  }
}

}  // namespace m3::cuda::detail
