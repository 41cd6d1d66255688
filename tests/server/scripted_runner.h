// A test model that answers from a script, so server tests can assert exact outputs (tool calls,
// reasoning, stop strings) through the real engine, text pipeline and HTTP layer.
//
// It behaves like a model in the ways the engine can observe: it stores the token id of every KV
// slot it is given (its "KV cache"), reads each sequence's history back through the page table,
// and its logits depend only on that history, so batching, chunked prefill, prefix caching and
// preemption all work as with a real model. The prediction: find the last occurrence of the
// generation marker (e.g. the chat template's "]~b]ai\n") in the history; the reply is the first
// one whose trigger occurs before it (an empty trigger matches any conversation); emit reply
// token j for the j-th position after the marker, then eos. Without a marker: eos.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/model_runner.h"

namespace m3::testing {

struct ScriptedReply {
  std::vector<int32_t> trigger;  // token ids that select this reply; empty: always
  std::vector<int32_t> tokens;   // the reply
};

class ScriptedRunner final : public ModelRunner {
 public:
  ScriptedRunner(int vocab_size, int block_size, int64_t num_kv_blocks, std::vector<int32_t> marker,
                 std::vector<ScriptedReply> replies, int32_t eos_token_id);

  int block_size() const override { return block_size_; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  int vocab_size() const override { return vocab_size_; }
  int64_t max_position_embeddings() const override { return num_kv_blocks_ * block_size_; }
  void forward(const StepBatch& batch, float* logits) override;

  // The token the script puts after `history` (for tests that predict outputs).
  int32_t predict(const std::vector<int32_t>& history) const;

 private:
  int vocab_size_;
  int block_size_;
  int64_t num_kv_blocks_;
  std::vector<int32_t> marker_;
  std::vector<ScriptedReply> replies_;
  int32_t eos_;
  std::vector<int32_t> slots_;  // token id per KV slot
};

}  // namespace m3::testing
