// KV insert: encodes the step's K, V (per KV head) and index-K rows into their cache slots with
// the formats/ codecs, so every byte equals the CPU encoder's. One CTA per token; one thread per
// 16-element group (nvfp4) or 8 elements (other dtypes).
//
// Also builds the E4M3 expansion table of the nvfp4 readers (device_common.cuh).
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kThreads = 128;

// Encodes `n` (a multiple of 16) bf16 values into one cache row of `dtype`.
__device__ void encode_part(KvDType dtype, const uint16_t* src, uint8_t* row, uint8_t* scales, int part) {
  float x[16];
  switch (dtype) {
    case KvDType::kNVFP4: {  // part = one 16-element group
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = bf16_decode(src[part * 16 + i]);
      nvfp4_kv_encode_group(x, row + part * 8, scales + part);
      break;
    }
    case KvDType::kFP8: {  // part = 8 elements
#pragma unroll
      for (int i = 0; i < 8; ++i) row[part * 8 + i] = fp8_e4m3_encode(bf16_decode(src[part * 8 + i]));
      break;
    }
    case KvDType::kBF16: {
      *reinterpret_cast<uint4*>(row + part * 16) = *reinterpret_cast<const uint4*>(src + part * 8);
      break;
    }
    case KvDType::kF32: {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        reinterpret_cast<float*>(row)[part * 8 + i] = bf16_decode(src[part * 8 + i]);
      break;
    }
  }
}

__global__ void __launch_bounds__(kThreads) kv_insert_kernel(const KvInsertArgs a) {
  kernel_prologue();
  const int token = blockIdx.x;
  const int slot = a.step.slot_mapping[token];
  if (slot < 0) return;
  const KvLayerView& c = a.cache;
  const int64_t block = slot / c.block_size;
  const int row = slot % c.block_size;
  const int kv_parts = c.kv_dtype == KvDType::kNVFP4 ? c.head_dim / 16 : c.head_dim / 8;
  const int idx_parts = a.index_k == nullptr || c.index_dim == 0
                            ? 0
                            : (c.index_dtype == KvDType::kNVFP4 ? c.index_dim / 16 : c.index_dim / 8);
  const int kv_items = 2 * c.num_kv_heads * kv_parts;
  for (int item = threadIdx.x; item < kv_items + idx_parts; item += kThreads) {
    if (item < kv_items) {
      const int part = item % kv_parts, head = (item / kv_parts) % c.num_kv_heads;
      const int which = item / (kv_parts * c.num_kv_heads);
      const uint16_t* src = (which == 0 ? a.k : a.v) + (int64_t(token) * c.num_kv_heads + head) * c.head_dim;
      encode_part(c.kv_dtype, src, c.kv_row(block, which, head, row),
                  c.kv_row_scales(block, which, head, row), part);
    } else {
      encode_part(c.index_dtype, a.index_k + int64_t(token) * c.index_dim, c.index_row(block, row),
                  c.index_row_scales(block, row), item - kv_items);
    }
  }
}

__global__ void e4m3_table_kernel(uint2* table) {
  kernel_prologue();
  const int scale = threadIdx.x;  // 256 threads: one scale byte each
  uint8_t bytes[8];
#pragma unroll
  for (int code = 0; code < 8; ++code)
    bytes[code] = fp8_e4m3_encode(nvfp4_value(static_cast<uint8_t>(code), static_cast<uint8_t>(scale)));
  uint2 v;
  v.x = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (uint32_t(bytes[3]) << 24);
  v.y = bytes[4] | (bytes[5] << 8) | (bytes[6] << 16) | (uint32_t(bytes[7]) << 24);
  table[scale] = v;
}

}  // namespace

cudaError_t launch_kv_insert(const KvInsertArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0) return cudaSuccess;
  launch_kernel(kv_insert_kernel, a.num_tokens, kThreads, 0, stream, a);
  return cudaGetLastError();
}

cudaError_t build_e4m3_table(uint2* table, cudaStream_t stream) {
  launch_kernel(e4m3_table_kernel, 1, 256, 0, stream, table);
  return cudaGetLastError();
}

}  // namespace m3::cuda::detail
