// The model's weights as loaded: the ops-level weight types (ops/weights.h) assembled per layer.
// Quantized tensors stay quantized (views into the mmap'd checkpoint where possible).
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "ops/backend.h"
#include "ops/weights.h"

namespace m3 {

struct AttentionWeights {
  LinearWeight q, k, v, o;
  Tensor q_norm, k_norm;  // F32 [head_dim]: the raw w of (1 + w)
  // Sparse (MSA) layers only:
  LinearWeight index_q, index_k;
  Tensor index_q_norm, index_k_norm;  // F32 [index_head_dim]
};

struct LayerWeights {
  Tensor input_norm;      // F32 [hidden]
  Tensor post_attn_norm;  // F32 [hidden]
  AttentionWeights attn;
  MlpWeights mlp;  // for MoE layers gate/up/down hold the shared expert
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden] F32, BF16 or F16 as stored
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // F32 [hidden]
  LinearWeight lm_head;
  std::vector<std::shared_ptr<const void>> keep_alive;  // mmaps and converted buffers
};

struct LoadProgress {
  virtual ~LoadProgress() = default;
  virtual void on_tensor(std::size_t done, std::size_t total) = 0;
};

// Loads every tensor the config needs from the checkpoint in `model_dir` (single file or
// sharded; the directory or its config.json). Both on-disk layouts of docs/reference.md D5 are
// accepted, detected from the tensor names; each linear's format comes from its own tensors
// (names + dtypes). Large tensors are zero-copy read-only views of the mapped files (never write
// through them); norms, router and bias are F32 copies. Vision, projector and mtp.* tensors are
// ignored; any other missing, unexpected or misshapen tensor is an error naming it.
// tie_word_embeddings: lm_head.weight is the embedding (dense, its dtype).
ModelWeights load_weights(const ModelConfig& config, const std::filesystem::path& model_dir,
                          LoadProgress* progress = nullptr);

// Random weights in the formats a real checkpoint of this config would have, for benchmarks
// (--load-format dummy): quantization_config's linear scheme for attention, indexer, dense MLPs
// and shared experts, its expert scheme for routed experts (M3.1: MXFP8 + NVFP4), BF16 when
// unquantized or listed in ignored_layers; BF16 embed/lm_head, F32 norms/router. Linears
// dequantize to ~N(0, 1/in_features). Deterministic in `seed`; multithreaded (threads: 0 for the
// host's cores, at most 64; the bytes never depend on it). model/dummy_shard.h builds one rank's
// slices of the same weights alone.
ModelWeights make_dummy_weights(const ModelConfig& config, uint64_t seed, unsigned threads = 0);

// `weights` with every tensor on `backend`'s device, as stored (Backend::to_device: formats,
// scales and the scalar fields of each LinearWeight kept); a host buffer shared between fields
// (tied embeddings) is copied once. The host copies are released when `weights` goes. The CPU
// backend keeps the tensors as they are.
ModelWeights place_weights(ModelWeights weights, Backend& backend);

}  // namespace m3
