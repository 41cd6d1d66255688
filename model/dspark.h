// The DSpark drafter (docs/speculative-decoding.md "The DSpark drafter"): its config, weights and
// its forward on the host in fp32 (the reference; the GPU path is not written yet).
//
// For every token the target computes, the target's residual stream after the layers
// target_layer_ids, concatenated, goes through fc and hidden_norm into c_t, and each drafter layer
// keeps K(c_t) (k_norm, RoPE at the token's position) and V(c_t) at the token's KV slot: the
// drafter's cache shares the target's block ids, so prefix caching, preemption and rejected drafts
// keep both in step (a slot the target overwrites, the drafter overwrites too). A proposal for a
// request whose last committed token is at position p and whose anchor (last sampled token) a is
// at p + 1 runs block_size queries [a, noise, ...] at p + 1 .. p + block_size through the layers:
// every query attends to the context keys within its sliding window (k_pos >= q_pos - (window - 1),
// k_pos <= p) and to all the block's keys (non-causal). The target's lm_head gives base logits;
// the Markov head adds w2 @ w1[prev] in order (prev: the anchor, then each draft) and the draft is
// the argmax; the confidence head estimates each draft's chance of being kept.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "ops/kv_layout.h"
#include "ops/sampling.h"
#include "ops/step_batch.h"
#include "ops/weights.h"

namespace m3 {

struct DSparkConfig {
  int vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int intermediate_size = 0;
  int rotary_dim = 0;
  double rope_theta = 0.0;
  float rms_norm_eps = 1e-6f, swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  int sliding_window = 0;
  std::vector<int> target_layer_ids;
  int block_size = 0;
  int32_t noise_token_id = 0;
  int markov_rank = 0;
  bool confidence_with_markov = true;
};

// dspark/config.json (DSparkMiniMaxDraftModel). Throws m3::Error naming the file and the field:
// another architecture, MoE or MSA layers, layers that are not sliding_attention, a missing field.
DSparkConfig load_dspark_config(const std::filesystem::path& dir);

struct DSparkLayerWeights {
  std::vector<float> input_norm, post_attn_norm, q_norm, k_norm;  // raw w of (1 + w)
  std::vector<float> q, k, v, o, gate, up, down;                  // [out, in], dequantized
};

struct DSparkWeights {
  std::vector<float> fc;  // [hidden, taps * hidden]
  std::vector<float> hidden_norm, final_norm;
  std::vector<DSparkLayerWeights> layers;
  std::vector<float> markov_w1, markov_w2;  // [vocab, rank] each
  std::vector<float> confidence_w;          // [hidden + rank]
  float confidence_b = 0.0f;
};

// Every tensor of the drafter's checkpoint (language_model.model.dspark.*, MXFP8 or bf16 linears),
// dequantized; a missing, misshapen or unexpected tensor is an error naming it.
DSparkWeights load_dspark_weights(const DSparkConfig& config, const std::filesystem::path& dir);

// One request's block to draft.
struct DSparkBlock {
  int32_t anchor = 0;       // the last sampled token
  int32_t anchor_pos = 0;   // its position p + 1 (the context is positions [0, p])
  std::span<const int32_t> block_table;  // the request's KV blocks (block_size tokens each)
  int num_drafts = 0;       // drafts wanted, <= config.block_size
  // Probabilistic drafts: the request's temperature, top_k, top_p and min_p shape each draft's
  // distribution (penalties, masks and biases are the target's, not the drafter's), and draft j is
  // drawn with draw_uniforms[j]. Null: greedy drafts (the argmax).
  const SampleRow* sampling = nullptr;
  std::span<const double> draw_uniforms;
};

struct DSparkDrafts {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> rows;  // probabilistic drafts: the distribution each was drawn from
  std::vector<float> confidence;
  std::vector<float> base_logits;  // [block_size, vocab]: only when asked (checks)
};

class DSparkDrafter {
 public:
  // embed and lm_head: the target's, [vocab, hidden] fp32. num_slots: KV slots (pool blocks x
  // kv_block_size tokens) the target addresses. cache_dtype: how its K and V are stored (f32,
  // bf16, or fp8 e4m3 without a scale, as vLLM's fp8 caches of unscaled values); m3::Error for
  // nvfp4.
  DSparkDrafter(DSparkConfig config, DSparkWeights weights, std::vector<float> embed, std::vector<float> lm_head,
                int64_t num_slots, int kv_block_size, KvDType cache_dtype = KvDType::kF32);

  const DSparkConfig& config() const { return config_; }
  // The target's taps of a step's tokens ([tokens, taps * hidden], row i for batch.token_ids[i]) into
  // the drafter's cache at the step's slots.
  void ingest(const StepBatch& batch, std::span<const float> taps);
  // Greedy drafts of a block (Markov head applied in order). keep_logits: fill base_logits.
  DSparkDrafts propose(const DSparkBlock& block, bool keep_logits = false) const;
  // The host tier of the prefix cache (ops/kv_layout.h KvBlockCopies): the drafter's part of each
  // block goes to the slot and comes back with the target's, copies to the host first.
  void copy_blocks(const KvBlockCopies& copies);

 private:
  void rope(float* x, int heads, int32_t pos) const;

  DSparkConfig config_;
  DSparkWeights w_;
  std::vector<float> embed_, lm_head_;
  int64_t num_slots_;
  int kv_block_size_;
  std::vector<float> inv_freq_;
  // K and V of a slot of a layer: [kv_heads * head_dim] each. Blocks are allocated the first time
  // the target writes them (host memory follows the blocks in use, not the pool's size).
  // which: 0 = K, 1 = V.
  void store(int layer, int which, int64_t slot, const float* row);
  void load(int layer, int which, int64_t slot, float* row) const;
  uint8_t* row_at(int layer, int which, int64_t slot) const;
  KvDType cache_dtype_;
  int64_t row_bytes_ = 0;
  // Per block: K then V of every layer, [layers][2][kv_block_size][kv_heads * head_dim] elements.
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  std::vector<std::unique_ptr<uint8_t[]>> host_slots_;  // the host tier's copies, by slot (null: none)
};

struct ModelWeights;

// The drafter in `dspark_dir` for a target of `target_config` whose weights are on the host
// (`target_weights`: its embedding and lm_head are the drafter's), with a cache of `num_slots` KV
// slots in blocks of kv_block_size tokens. Throws m3::Error naming what does not fit the target
// (vocabulary, width, a tap layer it does not have).
std::unique_ptr<DSparkDrafter> make_dspark_drafter(const std::filesystem::path& dspark_dir,
                                                   const ModelConfig& target_config,
                                                   const ModelWeights& target_weights, int64_t num_slots,
                                                   int kv_block_size, KvDType cache_dtype = KvDType::kF32);

}  // namespace m3
