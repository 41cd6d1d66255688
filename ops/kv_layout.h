// The paged KV cache's byte layout, shared by the CPU reference and the CUDA kernels.
//
// The pool is one buffer of `num_blocks` blocks. A block holds `block_size` consecutive tokens of
// one sequence for every layer (block-outer: one block moves as one contiguous piece). Inside a
// block, layer l's slab starts at layer_offset[l] and holds, in order:
//   K slot of kv head 0..H-1, V slot of kv head 0..H-1, then (sparse layers only) the index-K slot.
// A slot is `block_size` data rows followed by `block_size` scale rows (scale rows exist only for
// NVFP4). Data row widths: f32 4*dim, bf16 2*dim, fp8 dim, nvfp4 dim/2 bytes (two E2M1 codes per
// byte, even element in the low nibble); NVFP4 scale rows are dim/16 E4M3 bytes.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/hd.h"

namespace m3 {

enum class KvDType : uint8_t { kF32, kBF16, kFP8, kNVFP4 };

std::string_view kv_dtype_name(KvDType dtype);
// Accepts "float32"/"f32", "bfloat16"/"bf16", "fp8"/"fp8_e4m3", "nvfp4"; throws m3::Error otherwise.
KvDType parse_kv_dtype(std::string_view name);

M3_HD int kv_data_bytes(KvDType dtype, int dim) {
  switch (dtype) {
    case KvDType::kF32: return 4 * dim;
    case KvDType::kBF16: return 2 * dim;
    case KvDType::kFP8: return dim;
    case KvDType::kNVFP4: return dim / 2;
  }
  return 0;
}

M3_HD int kv_scale_bytes(KvDType dtype, int dim) { return dtype == KvDType::kNVFP4 ? dim / 16 : 0; }

// Whether queries meet a cache of this dtype in the E4M3 domain: fp8 and nvfp4 caches
// (ops/attention.h), for the attention K and the indexer's index-K alike.
M3_HD bool e4m3_queries(KvDType dtype) { return dtype == KvDType::kFP8 || dtype == KvDType::kNVFP4; }

// Where one layer's K, V and index-K live, as plain values a kernel can take by value.
struct KvLayerView {
  uint8_t* pool = nullptr;   // start of block 0
  int64_t block_bytes = 0;   // stride between blocks
  int64_t layer_offset = 0;  // this layer's slab inside a block
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int index_dim = 0;  // 0 when the layer has no index cache
  KvDType kv_dtype = KvDType::kBF16;
  KvDType index_dtype = KvDType::kBF16;

  M3_HD int64_t kv_slot_bytes() const {
    return int64_t(block_size) * (kv_data_bytes(kv_dtype, head_dim) + kv_scale_bytes(kv_dtype, head_dim));
  }
  M3_HD int64_t index_slot_bytes() const {
    return int64_t(block_size) *
           (kv_data_bytes(index_dtype, index_dim) + kv_scale_bytes(index_dtype, index_dim));
  }
  // Start of a slot: which = 0 for K, 1 for V.
  M3_HD uint8_t* kv_slot(int64_t block, int which, int head) const {
    return pool + block * block_bytes + layer_offset + (int64_t(which) * num_kv_heads + head) * kv_slot_bytes();
  }
  M3_HD uint8_t* index_slot(int64_t block) const {
    return pool + block * block_bytes + layer_offset + 2 * int64_t(num_kv_heads) * kv_slot_bytes();
  }
  M3_HD uint8_t* kv_row(int64_t block, int which, int head, int row) const {
    return kv_slot(block, which, head) + int64_t(row) * kv_data_bytes(kv_dtype, head_dim);
  }
  M3_HD uint8_t* kv_row_scales(int64_t block, int which, int head, int row) const {
    return kv_slot(block, which, head) + int64_t(block_size) * kv_data_bytes(kv_dtype, head_dim) +
           int64_t(row) * kv_scale_bytes(kv_dtype, head_dim);
  }
  M3_HD uint8_t* index_row(int64_t block, int row) const {
    return index_slot(block) + int64_t(row) * kv_data_bytes(index_dtype, index_dim);
  }
  M3_HD uint8_t* index_row_scales(int64_t block, int row) const {
    return index_slot(block) + int64_t(block_size) * kv_data_bytes(index_dtype, index_dim) +
           int64_t(row) * kv_scale_bytes(index_dtype, index_dim);
  }
};

// One block's move between the KV pool and the host tier of the prefix cache (--kv-offloading-size):
// pool bytes [block * block_bytes, + block_bytes) <-> host bytes [host_slot * block_bytes, ...).
// Block-outer, so the whole block (every layer's K, V and index-K slots, scale rows included)
// is one contiguous piece on both sides.
struct KvBlockCopy {
  int64_t block = 0;
  int64_t host_slot = 0;
};

// One step's copies between the pool and the host tier, queued before the step runs and made in
// this order (each batch after the previous one):
//   - to_host: blocks evicted now, which this step overwrites: the step waits for them;
//   - to_device: restored blocks, which this step reads: the step waits for them;
//   - to_host_ahead: cached blocks saved ahead of their eviction (unreferenced, so nothing writes
//     them until a later step reuses them): nothing waits, they overlap with the step.
// wait_for_batch: the step also waits for every copy of that earlier batch (and so of every batch
// before it): it reuses a block saved ahead there. Batches are numbered from 1 (`batch`).
struct KvBlockCopies {
  uint64_t batch = 0;
  std::vector<KvBlockCopy> to_host, to_device, to_host_ahead;
  uint64_t wait_for_batch = 0;
  bool empty() const { return to_host.empty() && to_device.empty() && to_host_ahead.empty() && wait_for_batch == 0; }
};

// Seconds block copies took so far, each way.
struct KvCopyTimes {
  double to_host_s = 0, to_device_s = 0;
};

// The whole pool's geometry.
struct KvLayout {
  int num_layers = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int index_dim = 0;
  KvDType kv_dtype = KvDType::kBF16;
  KvDType index_dtype = KvDType::kBF16;
  std::vector<bool> layer_has_index;  // sparse (MSA) layers
  std::vector<int64_t> layer_offset;  // bytes inside a block
  int64_t block_bytes = 0;

  static KvLayout make(int block_size, int num_kv_heads, int head_dim, int index_dim,
                       KvDType kv_dtype, KvDType index_dtype, std::vector<bool> layer_has_index);
  KvLayerView layer_view(uint8_t* pool, int layer) const;
  // K+V+index bytes that one token occupies across all layers.
  int64_t bytes_per_token() const { return block_size ? block_bytes / block_size : 0; }
};

}  // namespace m3
