// The DSpark drafter (docs/speculative-decoding.md "The DSpark drafter"): its config, weights and
// its forward, written against ops/backend.h like the target (the CPU backend is its reference).
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
#include "model/minimax_m3.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"
#include "ops/sampling.h"
#include "ops/token_constraint.h"
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
  Tensor input_norm, post_attn_norm, q_norm, k_norm;  // F32: the raw w of (1 + w)
  LinearWeight q, k, v, o, gate, up, down;           // as stored (MXFP8 or dense)
};

struct DSparkWeights {
  // fc [hidden, taps * hidden] cut into each tap's columns ([hidden, hidden] each): the drafter
  // applies them as the target's layers pass the taps, summing as it goes.
  std::vector<LinearWeight> fc;
  Tensor hidden_norm, final_norm;  // F32 [hidden]
  std::vector<DSparkLayerWeights> layers;
  MarkovHeadWeights heads;  // F32
  std::vector<std::shared_ptr<const void>> keep_alive;  // the checkpoint's mapping
};

// Every tensor of the drafter's checkpoint (language_model.model.dspark.*, MXFP8 or bf16 linears)
// on the host, quantized linears as stored; a missing, misshapen or unexpected tensor is an error
// naming it.
DSparkWeights load_dspark_weights(const DSparkConfig& config, const std::filesystem::path& dir);
// The same weights on `backend`'s device (Backend::to_device: formats kept).
DSparkWeights place_dspark_weights(DSparkWeights weights, Backend& backend);

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
  // A structured-output constraint as it stands after the anchor (null: none): draft j is the best
  // token (or a draw) among those its mask allows after drafts [0, j), with remaining_tokens - j
  // tokens left to produce; the block ends where the output is complete. Left as it was found.
  TokenConstraint* constraint = nullptr;
  int remaining_tokens = 0;
};

struct DSparkDrafts {
  std::vector<int32_t> tokens;
  std::vector<TokenDistribution> rows;  // probabilistic drafts: the distribution each was drawn from
  std::vector<float> confidence;
  std::vector<float> base_logits;  // [block_size, vocab]: only when asked (checks)
};

// The drafter on the target's backend (rank 0's), its KV cache in a pool of its own that shares the
// target's block ids. It reads the target's residual stream as a LayerTaps (model/minimax_m3.h):
// at each tap layer, fc's columns of that tap go into the context rows, and after the last one
// hidden_norm and each layer's K (k_norm, RoPE) and V go into its cache at the step's slots, all as
// run ops of the target's step (CUDA graphs record them with it). propose() runs one step of its
// own on the backend: the blocks of every request through the layers, the target's lm_head, then
// the Markov and confidence heads (greedy on the backend; probabilistic and constrained blocks on
// the host).
//
// Its RoPE is the target's table (the backend holds one): make_dspark_drafter checks that the
// drafter's frequencies are the target's first ones.
class DSparkDrafter final : public LayerTaps {
 public:
  // embed [vocab, hidden] and lm_head: the target's whole (not vocab-parallel) tensors on the
  // backend's device. host_heads: the Markov and confidence heads on the host (probabilistic
  // drafts). num_kv_blocks blocks of kv_block_size tokens (the target's pool), num_host_kv_blocks
  // host-tier slots; cache_dtype f32, bf16 or fp8 (m3::Error for nvfp4).
  DSparkDrafter(DSparkConfig config, DSparkWeights weights, MarkovHeadWeights host_heads, Backend& backend,
                Tensor embed, LinearWeight lm_head, int64_t num_kv_blocks, int kv_block_size, KvDType cache_dtype,
                int64_t num_host_kv_blocks = 0);

  const DSparkConfig& config() const { return config_; }
  KvDType cache_dtype() const { return layout_.kv_dtype; }
  // Bytes of one pool block of the drafter's cache (all its layers' K and V).
  int64_t kv_block_bytes() const { return layout_.block_bytes; }

  // LayerTaps: the target's step feeds the cache.
  const std::vector<int>& tap_layers() const override { return config_.target_layer_ids; }
  int64_t reserve_taps(int64_t tokens) override;
  void tap(int index, const Tensor& x) override;

  // Drafts for each block (greedy ones by the backend's markov_drafts, probabilistic ones on the
  // host), blocks of at most kMaxRowsPerStep / block_size requests per step of the backend. The
  // backend's planned step is the drafter's afterwards. keep_logits: fill base_logits.
  std::vector<DSparkDrafts> propose(std::span<const DSparkBlock> blocks, bool keep_logits = false);
  // The host tier of the prefix cache (ops/kv_layout.h KvBlockCopies): the drafter's part of each
  // block goes to the slot and comes back with the target's (Backend::copy_kv_blocks).
  void copy_blocks(const KvBlockCopies& copies);

  static constexpr int kMaxRowsPerStep = 512;

 private:
  void ensure_step_buffers(int64_t rows);
  void propose_chunk(std::span<const DSparkBlock> blocks, bool keep_logits, DSparkDrafts* out);
  KvLayerView layer_view(int layer) const { return layout_.layer_view(pool_.data_as<uint8_t>(), layer); }

  DSparkConfig config_;
  DSparkWeights w_;
  MarkovHeadWeights host_heads_;
  Backend& backend_;
  Tensor embed_;
  LinearWeight lm_head_;
  KvLayout layout_;
  Tensor pool_, host_tier_;
  // The taps' rows: context (fc summed over the taps, then hidden_norm), one tap's part, K and V.
  Tensor ctx_, ctx_part_, ctx_k_, ctx_v_;
  int64_t tap_rows_ = 0, tap_generation_ = 0;
  int taps_seen_ = 0;
  // The draft step: its batch (the backend reads it until the step ends) and activations.
  StepBatch step_;
  Tensor x_, hn_, q_, bk_, bv_, attn_, o_, mlp_, logits_;
  Tensor head_in_;  // the final norm's rows the heads read, gathered (when fewer than the block's)
  int64_t step_rows_ = 0, step_generation_ = 0;
};

// A drafter of `config` with host `weights` for a target of `target_config` on `backend`: embed and
// lm_head the target's whole tensors on the backend's device. Throws m3::Error naming `source` and
// what does not fit the target (vocabulary, width, a tap layer it does not have, RoPE other than
// the target's).
std::unique_ptr<DSparkDrafter> make_dspark_drafter(DSparkConfig config, DSparkWeights weights, const std::string& source,
                                                   const ModelConfig& target_config, Backend& backend, Tensor embed,
                                                   LinearWeight lm_head, int64_t num_kv_blocks, int kv_block_size,
                                                   KvDType cache_dtype, int64_t num_host_kv_blocks = 0);
// The same for the drafter in `dspark_dir` (its config.json and weights).
std::unique_ptr<DSparkDrafter> load_dspark_drafter(const std::filesystem::path& dspark_dir,
                                                   const ModelConfig& target_config, Backend& backend, Tensor embed,
                                                   LinearWeight lm_head, int64_t num_kv_blocks, int kv_block_size,
                                                   KvDType cache_dtype, int64_t num_host_kv_blocks = 0);

// Random weights of a drafter of `config` in the formats the M3.1 drafter ships (MXFP8 linears,
// F32 norms and heads), deterministic in `seed`: benchmarks without a checkpoint (bench latency
// --spec-drafter with --load-format dummy).
DSparkWeights make_dummy_dspark_weights(const DSparkConfig& config, uint64_t seed);

// The drafter's KV pool geometry: K and V of its layers in blocks of kv_block_size tokens (the
// target's), no index-K. The drafter's pool uses it; loaders size pools with it.
KvLayout dspark_kv_layout(const DSparkConfig& config, int kv_block_size, KvDType cache_dtype);

}  // namespace m3
