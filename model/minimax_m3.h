// MiniMaxM3: the MiniMax-M3 text model's forward pass over a paged, batched StepBatch, written
// once against ops/backend.h (docs/reference.md 2; docs/reference.md D2-D3).
//
// Contract for the engine:
//  - The model owns the KV pool (num_kv_blocks blocks of block_size() tokens, ops::KvLayout,
//    block-outer); the engine owns block allocation: physical block ids in StepBatch.page_table
//    and slot_mapping must be < num_kv_blocks() and must not be shared by two sequences unless
//    their contents are identical (prefix cache).
//  - forward() handles any mix of prefill chunks and decode tokens across sequences: a sequence's
//    tokens are its last q_len positions (StepBatch invariants); the KV of every earlier position
//    of that sequence must already be in its pages (written by earlier steps).
//  - Logits of the rows batch.logits_rows (in that order) are written as fp32 to
//    logits [logits_rows.size(), vocab_size] (host memory).
//  - Not thread-safe: one forward at a time.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/backend.h"
#include "ops/kv_layout.h"
#include "ops/step_batch.h"
#include "parallel/communicator.h"
#include "parallel/layout.h"

namespace m3 {

struct ModelRuntimeOptions {
  DType activation_dtype = DType::kF32;  // kF32 or kBF16
  KvDType kv_dtype = KvDType::kF32;      // K and V
  KvDType index_dtype = KvDType::kF32;   // index-K of sparse layers
  int64_t num_kv_blocks = 0;             // pool size in blocks (> 0)
  // Host tier of the prefix cache (--kv-offloading-size): slots of one pool block each in host
  // memory the backend copies to and from (pinned on the GPU); 0: none.
  int64_t num_host_kv_blocks = 0;
};

// The part of the model one instance runs when the model is split over ranks (parallel/layout.h):
// the shard says which query, KV and index heads, experts and vocabulary rows its weights hold
// (model/weight_shard.h cuts them), `tp` is its tensor-parallel group. The row-parallel outputs
// (o_proj, the MLP / MoE down projections, the vocab-parallel embedding) are all-reduced over tp;
// the vocab-parallel logits are all-gathered, so every rank ends a step with the full logits.
struct ModelPartition {
  RankShard shard;
  int64_t padded_vocab_size = 0;  // shard.vocab slices this; rows past vocab_size are padding
  Communicator* tp = nullptr;     // null: one rank (the whole model)
  // Indexer decode context parallelism: the tp ranks split the index cache's blocks instead of
  // the index heads (docs/reference.md, the indexer): each scores its blocks for every head, the
  // candidates are all-gathered and merged into the exact selection one rank makes.
  bool indexer_decode_cp = false;
  // Data-parallel attention (DEP): this rank's copy (its `tp` group, or this rank alone with -tp 1)
  // runs its own requests through the attention, dense and shared-expert weights, and `ep` shares
  // the routed experts: the ranks with this rank's tp rank in every copy (one rank per copy, so
  // every rank with -tp 1). Each MoE layer all-gathers the copies' tokens over `ep`, runs the
  // experts this rank holds over all of them, reduce-scatters the sums back to their copies, and
  // (-tp > 1) the copy's all-reduce after the MoE adds up its ranks' experts (mlp_block says why
  // that is exact). Every rank takes part in every step (idle_step() when its copy has no tokens).
  Communicator* ep = nullptr;
  // The same ranks over host memory (Gloo), for the one number they agree on before each step
  // (the most tokens any copy has), so that a GPU rank needs no device-to-host wait for it. On the
  // CPU it may be `ep` itself.
  Communicator* ep_host = nullptr;
};
// The partition of a model that is not split: one rank holding everything.
ModelPartition whole_model(const ModelConfig& config);

// The ops-level description a backend is configured with (geometry, indexer, RoPE table).
// Throws m3::Error for what no backend runs (length-dependent RoPE frequencies).
BackendConfig backend_config(const ModelConfig& config, DType activation_dtype);
// The same for the rank holding `shard`'s heads.
BackendConfig backend_config(const ModelConfig& config, DType activation_dtype, const RankShard& shard);

// The KV pool geometry of `config` (the page is the MSA block, index_block_size tokens; index-K
// slots on sparse layers only). The model's pool uses it; loaders size the pool with it.
KvLayout kv_layout_for(const ModelConfig& config, KvDType kv_dtype, KvDType index_dtype);
// The same for a rank holding `kv_heads` of the KV heads (parallel/layout.h RankShard::kv_heads);
// the index-K slot stays whole: its one key head is shared by every index head.
KvLayout kv_layout_for(const ModelConfig& config, KvDType kv_dtype, KvDType index_dtype, int kv_heads);

// "auto" -> float32 for fp32 activations, bfloat16 for bf16 ones; otherwise parse_kv_dtype.
KvDType resolve_kv_dtype(const std::string& name, DType activation_dtype);
// "float32"/"fp32"/"f32" -> kF32, "bfloat16"/"bf16" -> kBF16, "auto" -> kBF16; else m3::Error.
DType parse_activation_dtype(const std::string& name);

// What reads the residual stream between the layers (speculative decoding's drafter,
// model/dspark.h). During forward(), after each tap layer (its output, before the final norm),
// tap(i, x) with i the layer's index in tap_layers() and x [tokens, hidden]; the taps come in layer
// order. tap() may only queue backend run ops on tensors that stay put (a step may be recorded as
// a CUDA graph and replayed without calling it); reserve_taps(tokens), called before the step's
// ops, makes room and returns a number that changes whenever one of its tensors moves.
class LayerTaps {
 public:
  virtual ~LayerTaps() = default;
  virtual const std::vector<int>& tap_layers() const = 0;
  virtual int64_t reserve_taps(int64_t tokens) = 0;
  virtual void tap(int index, const Tensor& x) = 0;
};

class MiniMaxM3 {
 public:
  // `weights` are the partition's (model/weight_shard.h; the full weights for whole_model()).
  MiniMaxM3(ModelConfig config, ModelWeights weights, Backend& backend, ModelRuntimeOptions options);
  MiniMaxM3(ModelConfig config, ModelWeights weights, Backend& backend, ModelRuntimeOptions options,
            ModelPartition partition);

  const ModelConfig& config() const { return config_; }
  const ModelRuntimeOptions& options() const { return options_; }
  const ModelWeights& weights() const { return weights_; }
  const ModelPartition& partition() const { return partition_; }
  Backend& backend() const { return backend_; }
  // Tokens per KV page: config.index_block_size (128 for real models).
  int block_size() const { return layout_.block_size; }
  int64_t num_kv_blocks() const { return options_.num_kv_blocks; }
  // K + V + index-K bytes of one token across all layers (of this rank's KV heads).
  int64_t kv_bytes_per_token() const { return layout_.bytes_per_token(); }
  int64_t kv_pool_bytes() const { return layout_.block_bytes * options_.num_kv_blocks; }
  const KvLayout& kv_layout() const { return layout_; }
  // The KV pool (U8, kv_pool_bytes(), on the backend's device): for checks that compare caches.
  const Tensor& kv_pool() const { return kv_pool_; }
  int64_t num_host_kv_blocks() const { return options_.num_host_kv_blocks; }
  // This rank's bytes of the given blocks: pool -> host slots (to_host) and host slots -> pool
  // (to_device), after the step before; the step after waits for them as Backend::copy_kv_blocks
  // says. Every id must be in range (m3::Error otherwise).
  void copy_kv_blocks(const KvBlockCopies& copies);
  KvCopyTimes kv_copy_times() const { return backend_.kv_copy_times(); }

  // One engine step. Throws m3::Error on malformed batches (wrong sizes, block ids out of range).
  // logits == nullptr leaves them on the device (forward_sample).
  void forward(const StepBatch& batch, float* logits);
  // One engine step that samples on the backend: forward, then the logits rows `host_rows`
  // (indices into batch.logits_rows, any order) to host_logits [host_rows.size(), vocab] (fp32),
  // then sampled_ids[i] for sampling.rows[i] and logprobs[j] for sampling.logprobs[j]
  // (SampleRow::logits_row and LogprobRow::logits_row index batch.logits_rows). Only those rows,
  // the ids and the logprobs leave the device.
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits);
  // Data-parallel attention: this rank's part of a step its peers run while its copy has no tokens
  // of its own (the MoE layers' exchanges and its experts' work on the peers' tokens). Every rank
  // of the copy calls it for the same step (the copy's runner drives them together).
  void idle_step();
  bool attention_data_parallel() const { return partition_.ep != nullptr; }

  // Speculative decoding's drafter reads the residual stream (LayerTaps); null: nothing does. The
  // taps must outlive the model or be unset first. m3::Error for a tap layer the model lacks.
  void set_taps(LayerTaps* taps);

 private:
  struct Activations {
    int64_t capacity_tokens = 0;
    int64_t generation = 0;  // bumped whenever a tensor below moves (ReplayKey::buffers_generation)
    Tensor x, h, q, k, v, index_q, index_k, attn, selection, mlp, logit_rows;
    Tensor index_q_parts, candidates, gathered_candidates;  // indexer decode CP
    Tensor dep_gathered, dep_routed, dep_mine;               // data-parallel attention
  };
  void validate(const StepBatch& batch) const;
  void ensure_activations(int64_t tokens, int64_t logit_rows);
  void attention_block(int layer, Activations& a);
  // Sums a row-parallel output over the tensor-parallel group (nothing on one rank).
  void reduce_tp(Tensor x);
  // The MoE constants of this rank (its first held expert included).
  MoeParams moe_params() const;
  // Data-parallel attention: the most tokens any copy has this step (every rank calls it once per
  // step), and this rank's routed experts over every copy's tokens, summed over the `ep` group
  // into routed_out for this copy's rows.
  int64_t dep_step_tokens(int64_t t);
  void dep_routed_experts(int layer, Tensor routed_out);
  void ensure_dep_buffers(int64_t max_tokens);
  int64_t dep_max_tokens_ = 0;
  void mlp_block(int layer, Activations& a);
  // embed .. lm_head of the planned step into logits_ (everything between plan() and the copy).
  void run_layers(int64_t tokens, int64_t logit_rows);
  // x [tokens, hidden]: the output of `layer`, to the taps when it is a tap layer.
  void tap(int layer, const Tensor& x);
  bool is_tap_layer(int layer) const;
  LayerTaps* taps_ = nullptr;

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  ModelRuntimeOptions options_;
  ModelPartition partition_;
  int q_heads_ = 0, kv_heads_ = 0, index_heads_ = 0;  // this rank's
  KvLayout layout_;
  Tensor kv_pool_;
  Tensor kv_host_tier_;  // num_host_kv_blocks blocks of layout_.block_bytes, or undefined
  Activations act_;
  Tensor logits_;  // [logit rows capacity, vocab]
  // Tensor parallel: this rank's vocabulary slice of the logits, and every rank's after the gather.
  Tensor rank_logits_, gathered_logits_;
};

}  // namespace m3
