// Where the text model's tensors live in a checkpoint (docs/reference.md D5), detected from the names
// the checkpoint holds, never from file names:
//   release:              language_model.model.layers.N..., language_model.lm_head.weight
//   VL save_pretrained:   model.language_model.layers.N...,  lm_head.weight
//   text save_pretrained: model.layers.N...,                 lm_head.weight
// Per-layer spellings (block_sparse_moe.* vs mlp.*, index_q_proj vs indexer.q_proj, per-expert
// w1/w2/w3 vs 3-D gate_up_proj/down_proj) are resolved per layer by the loader.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

struct CheckpointLayout {
  std::string model_prefix;  // "language_model.model.", "model.language_model." or "model."
  std::string lm_head;       // base name of the output projection (no ".weight")

  std::string layer(int i) const { return model_prefix + "layers." + std::to_string(i) + "."; }
};

// Throws naming what was looked for when no text model is found.
CheckpointLayout detect_checkpoint_layout(const std::vector<std::string>& names);

// Tensors the text model never reads: vision tower, projector, patch merger, MTP modules (the
// reference ignores `mtp.`), non-persistent RoPE buffers.
bool is_ignored_tensor(std::string_view name);

}  // namespace m3
