// The ModelRunner over the MiniMax-M3 model (model/minimax_m3.h). The model must outlive the
// runner (and so the EngineCore that owns it):
//   MiniMaxM3 model(...);
//   EngineCore engine(std::make_unique<MiniMaxM3Runner>(model), config);
#pragma once
#include "engine/model_runner.h"

namespace m3 {

class MiniMaxM3;

class MiniMaxM3Runner final : public ModelRunner {
 public:
  explicit MiniMaxM3Runner(MiniMaxM3& model);
  int block_size() const override;
  int64_t num_kv_blocks() const override;
  int vocab_size() const override;
  int64_t max_position_embeddings() const override;
  void forward(const StepBatch& batch, float* logits) override;
  // Samples on the model's backend (the CUDA backend: on the GPU, only ids and host_rows copied).
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      const std::vector<int32_t>& host_rows, float* host_logits) override;

 private:
  MiniMaxM3& model_;
};

}  // namespace m3
