#include "ops/kv_layout.h"

#include "core/error.h"

namespace m3 {

std::string_view kv_dtype_name(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: return "float32";
    case KvDType::kBF16: return "bfloat16";
    case KvDType::kFP8: return "fp8_e4m3";
    case KvDType::kNVFP4: return "nvfp4";
  }
  return "?";
}

KvDType parse_kv_dtype(std::string_view name) {
  if (name == "float32" || name == "f32" || name == "fp32") return KvDType::kF32;
  if (name == "bfloat16" || name == "bf16") return KvDType::kBF16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "e4m3") return KvDType::kFP8;
  if (name == "nvfp4" || name == "fp4") return KvDType::kNVFP4;
  fail("unsupported KV cache dtype '{}' (expected auto, float32, bfloat16, fp8, fp8_e4m3 or nvfp4)",
       name);
}

KvLayout KvLayout::make(int block_size, int num_kv_heads, int head_dim, int index_dim,
                        KvDType kv_dtype, KvDType index_dtype, std::vector<bool> layer_has_index) {
  M3_CHECK(block_size > 0 && num_kv_heads > 0 && head_dim > 0, "invalid KV layout geometry");
  if (kv_dtype == KvDType::kNVFP4)
    M3_CHECK(head_dim % 16 == 0, "nvfp4 KV cache needs head_dim divisible by 16 (got {})", head_dim);
  if (index_dtype == KvDType::kNVFP4 && index_dim > 0)
    M3_CHECK(index_dim % 16 == 0, "nvfp4 index cache needs index_head_dim divisible by 16 (got {})",
             index_dim);
  KvLayout l;
  l.num_layers = static_cast<int>(layer_has_index.size());
  l.block_size = block_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.index_dim = index_dim;
  l.kv_dtype = kv_dtype;
  l.index_dtype = index_dtype;
  l.layer_has_index = std::move(layer_has_index);
  const int64_t kv_slot =
      int64_t(block_size) * (kv_data_bytes(kv_dtype, head_dim) + kv_scale_bytes(kv_dtype, head_dim));
  const int64_t index_slot =
      int64_t(block_size) * (kv_data_bytes(index_dtype, index_dim) + kv_scale_bytes(index_dtype, index_dim));
  int64_t offset = 0;
  for (int i = 0; i < l.num_layers; ++i) {
    l.layer_offset.push_back(offset);
    offset += 2 * int64_t(num_kv_heads) * kv_slot;
    if (l.layer_has_index[i]) offset += index_slot;
    offset = (offset + 255) / 256 * 256;  // keep every slab 256-byte aligned for vector loads
  }
  l.block_bytes = offset;
  return l;
}

KvLayerView KvLayout::layer_view(uint8_t* pool, int layer) const {
  M3_CHECK(layer >= 0 && layer < num_layers, "layer {} out of range [0, {})", layer, num_layers);
  KvLayerView v;
  v.pool = pool;
  v.block_bytes = block_bytes;
  v.layer_offset = layer_offset[layer];
  v.block_size = block_size;
  v.num_kv_heads = num_kv_heads;
  v.head_dim = head_dim;
  v.index_dim = layer_has_index[layer] ? index_dim : 0;
  v.kv_dtype = kv_dtype;
  v.index_dtype = index_dtype;
  return v;
}

}  // namespace m3
