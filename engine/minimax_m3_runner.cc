#include "engine/minimax_m3_runner.h"

#include "model/minimax_m3.h"

namespace m3 {

MiniMaxM3Runner::MiniMaxM3Runner(MiniMaxM3& model) : model_(model) {}

int MiniMaxM3Runner::block_size() const { return model_.block_size(); }
int64_t MiniMaxM3Runner::num_kv_blocks() const { return model_.num_kv_blocks(); }
int MiniMaxM3Runner::vocab_size() const { return model_.config().vocab_size; }
int64_t MiniMaxM3Runner::max_position_embeddings() const { return model_.config().max_position_embeddings; }
void MiniMaxM3Runner::forward(const StepBatch& batch, float* logits) { model_.forward(batch, logits); }
void MiniMaxM3Runner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                     const std::vector<int32_t>& host_rows, float* host_logits) {
  model_.forward_sample(batch, sampling, sampled_ids, host_rows, host_logits);
}

}  // namespace m3
