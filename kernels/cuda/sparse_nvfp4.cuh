// What the two sparse attention kernels over an NVFP4 KV cache (Q8KV4) share (sparse_rows.cu:
// rows alone, sparse_groups.cu: row groups): the staged 64-token tile and its layout, where a
// walk's tiles come from (TileSource), a tile's copy sources and async copy (tile_copy_source and
// issue_tile: the union walk's producer; the row walk keeps the same sources in two arrays of its
// own), the byte transpose of V's decode, and how a walk's result is stored.
#pragma once
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace m3::cuda::detail::sparse_nvfp4 {

constexpr int kThreads = 128;  // one warpgroup

// A staged tile: K codes (64 rows of 64 bytes), K scales (64 x 8), then V the same.
constexpr int kHalfBytes = kTileTokens * (kDim / 2 + kDim / 16);
constexpr int kScaleOffset = kTileTokens * kDim / 2;
constexpr int kStageBytes = 2 * kHalfBytes;
constexpr int kTableBytes = 256 * 8;

// Four rows of 4 bytes to four columns: out[j] byte r = in[r] byte j.
__device__ __forceinline__ void transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(in[0], in[1], 0x5140), t1 = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t t2 = __byte_perm(in[0], in[1], 0x7362), t3 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(t0, t1, 0x5410), out[1] = __byte_perm(t0, t1, 0x7632);
  out[2] = __byte_perm(t2, t3, 0x5410), out[3] = __byte_perm(t2, t3, 0x7632);
}

// Where a walk's tiles come from: KV head `kv`'s K slot in block 0 of this layer, and the strides to
// a block and to the V slot. Made once per walk, so that a tile's copies cost a multiply-add instead
// of the layout's dtype switches (an NVFP4 slot is block_size x (kDim / 2 codes + kDim / 16 scales)).
struct TileSource {
  const uint8_t* k_head;
  int64_t block_bytes, v_offset;
  int block_size;
};
__device__ __forceinline__ TileSource tile_source(const AttentionArgs& a, int kv) {
  const int64_t slot_bytes = int64_t(a.cache.block_size) * (kDim / 2 + kDim / 16);
  return {a.cache.pool + a.cache.layer_offset + kv * slot_bytes, a.cache.block_bytes,
          a.cache.num_kv_heads * slot_bytes, a.cache.block_size};
}

// A tile's copy sources: its K codes and K scales (V's are TileSource::v_offset further), made once
// per tile by a walk's listing rather than in every copy: from the block, the page and the tile's
// place they took ~75 instructions a warp a tile (ncu, session 50).
struct TileCopySource {
  const uint8_t* codes;
  const uint8_t* scales;
};
__device__ __forceinline__ TileCopySource tile_copy_source(const TileSource& src, int phys, int tile_in_block) {
  const uint8_t* slot = src.k_head + phys * src.block_bytes;
  const int tok0 = tile_in_block * kTileTokens;
  return {slot + tok0 * (kDim / 2), slot + src.block_size * (kDim / 2) + tok0 * (kDim / 16)};
}

// Issues the async copies of the tile at `s` (K then V) into the stage at `dst`, then commits; with
// no tile (s null, past the walk's end) it commits alone, so that the wait counts hold. `tid`: the
// thread among the kThreads that copy.
__device__ __forceinline__ void issue_tile(const TileCopySource* s, int64_t v_offset, uint8_t* dst, int tid) {
  if (s != nullptr) {
    const TileCopySource c = *s;
    stage_tile<KvDType::kNVFP4, kThreads>(dst, c.codes, c.scales, tid);
    stage_tile<KvDType::kNVFP4, kThreads>(dst + kHalfBytes, c.codes + v_offset, c.scales + v_offset, tid);
  }
  cp_async_commit();
}

// A walk's result for one (row, head) once its numerator is written: the partial's running
// maximum and normaliser, or the row's LSE (natural log; the normaliser carries P8's 448).
__device__ __forceinline__ void store_partial_ml(const AttentionArgs& a, int64_t p, float m, float l) {
  a.partial_ml[p * 2] = m;
  a.partial_ml[p * 2 + 1] = l;
}
__device__ __forceinline__ float q8kv4_lse(float m, float l, float sm_scale) {
  return l > 0.0f ? m * sm_scale + logf(l) - kLn448 : -INFINITY;
}

}  // namespace m3::cuda::detail::sparse_nvfp4
