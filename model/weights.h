// The model's weights as loaded: quantized tensors stay quantized (views into the mmap'd
// checkpoint where possible); the backend decides how to use them.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace m3 {

enum class WeightFormat {
  kDense,   // F32 / BF16 / F16 [out, in]
  kFp8,     // F8_E4M3 [out, in], per-tensor or none: value = fp8 * scale (scale [1] or absent)
  kMxfp8,   // F8_E4M3 [out, in] + UE8M0 scale [out, in/32]: value = fp8 * 2^(s-127)
  kNvfp4,   // U8 [out, in/2] + E4M3 scale [out, in/16]: value = e2m1 * scale * global_scale
};

// One linear layer y = x W^T, in whatever format the checkpoint stores.
struct LinearWeight {
  std::string name;  // checkpoint tensor name (without the .weight suffix), for errors
  int64_t out_features = 0;
  int64_t in_features = 0;
  WeightFormat format = WeightFormat::kDense;
  Tensor weight;
  Tensor scale;               // kMxfp8: U8 [out, in/32]; kNvfp4: F8_E4M3 [out, in/16]; kFp8: F32 [1] or undefined
  float global_scale = 1.0f;  // kNvfp4: 1/weight_global_scale (compressed-tensors) or weight_scale_2 (ModelOpt)
  float input_scale = 0.0f;   // ModelOpt activation scale, recorded only (0 when absent)

  // Rows [begin, end) of the output dimension, sharing memory.
  LinearWeight rows(int64_t begin, int64_t end) const;
};

struct ExpertWeights {
  LinearWeight gate;  // w1 / first half of gate_up
  LinearWeight up;    // w3 / second half of gate_up
  LinearWeight down;  // w2
};

struct AttentionWeights {
  LinearWeight q, k, v, o;
  Tensor q_norm, k_norm;  // F32 [head_dim]: the raw w of (1 + w)
  // Sparse (MSA) layers only:
  LinearWeight index_q, index_k;
  Tensor index_q_norm, index_k_norm;  // F32 [index_head_dim]
};

struct MlpWeights {
  // Dense layers, and the shared expert of MoE layers:
  LinearWeight gate, up, down;
  // MoE layers:
  Tensor router;       // F32 [num_experts, hidden]
  Tensor router_bias;  // F32 [num_experts] (e_score_correction_bias)
  std::vector<ExpertWeights> experts;
};

struct LayerWeights {
  Tensor input_norm;      // F32 [hidden]
  Tensor post_attn_norm;  // F32 [hidden]
  AttentionWeights attn;
  MlpWeights mlp;  // for MoE layers gate/up/down hold the shared expert
};

struct ModelWeights {
  Tensor embed;  // [vocab, hidden] F32 or BF16
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
// sharded). Both on-disk layouts of spec decision 5 are accepted; a missing or unexpected tensor
// is an error naming it.
ModelWeights load_weights(const ModelConfig& config, const std::filesystem::path& model_dir,
                          LoadProgress* progress = nullptr);

// Random weights in the formats a real checkpoint of this config would have (MXFP8 attention and
// dense MLPs, NVFP4 routed experts when the config declares them, BF16 otherwise), for benchmarks.
ModelWeights make_dummy_weights(const ModelConfig& config, uint64_t seed);

}  // namespace m3
