// Backend: the few fused operations the MiniMax-M3 layer graph needs, written once against this
// interface (model/minimax_m3.cc) and implemented per device (kernels/cpu: the exact reference;
// kernels/cuda: fast). model/ never knows which backend runs.
//
// Tensors passed to a backend live on backend.device(). Activations are 2-D row-major
// [tokens, features] tensors made by alloc(); their storage dtype is the backend's choice
// (activation_storage_dtype(): the CPU backend stores F32 and, when the activation dtype is
// bfloat16, rounds every op's output to bf16 exactly where the Hugging Face model in bf16 rounds:
// outputs of linears, norms, RoPE, attention, the SwiGLU product, expert contributions, MoE sums
// and residual adds; accumulation is always fp32).
//
// Plan / run: plan(batch) takes the step's metadata (token ids, positions, page tables, slots,
// logits rows) once per step and prepares everything derived from it (RoPE cos/sin, device copies,
// schedules); every other call is a "run" op that reads the planned metadata, allocates nothing
// in steady state and never synchronises (CUDA graph capturable). Ops run in call order.
//
// Weights are the structs of ops/weights.h (plain data: quantized tensors stay quantized; a
// backend dequantizes on the fly, exactly, and never keeps a dequantized copy). A backend knows
// nothing of the model beyond BackendConfig; model/ describes itself in those terms.
#pragma once
#include <compare>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/draft_heads.h"
#include "ops/kv_layout.h"
#include "ops/sampling.h"
#include "ops/step_batch.h"
#include "ops/weights.h"

namespace m3 {

// One output of Backend::linears: out = x weight^T.
struct LinearOutput {
  const LinearWeight* weight = nullptr;
  Tensor out;
};

// The operands of Backend::attention_input, all [T, heads * dim] activations normed and roped in
// place (views; v is only read), the norms F32 [dim].
struct AttentionInputs {
  Tensor q;
  int num_q_heads = 0;
  Tensor k, v;
  Tensor q_norm, k_norm;
  Tensor index_k, index_k_norm;  // [T, Di]; undefined: no index cache (dense layers)
  Tensor index_q, index_q_norm;  // [T, index_heads * Di]; undefined: no index queries
  int index_heads = 0;
  float eps = 1e-6f;
  int rope_dims = 0;        // q and k
  int index_rope_dims = 0;  // index_k and index_q
};

// What a backend is configured with before any op: the attention geometry of the model it will
// run (to pre-size scratch and pick kernels), its RoPE table and the activation numerics.
struct BackendConfig {
  DType activation_dtype = DType::kF32;  // kF32 or kBF16
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;             // tokens per KV page (= the MSA block)
  bool has_sparse_layers = false;  // some layer runs the indexer
  int index_dim = 0;              // index head dim (0 without sparse layers)
  IndexerParams indexer;          // block selection of the sparse layers
  // RoPE: the planned cos/sin of position p over rotary_dim channels are
  // cos(p * inv_freq[i]) * attention_factor, i < rotary_dim / 2 (fp32, as the reference).
  int rotary_dim = 0;
  std::vector<float> rope_inv_freq;  // [rotary_dim / 2] at least
  float rope_attention_factor = 1.0f;
};

// MoE routing constants of one MoE layer.
struct MoeParams {
  int num_experts = 0;
  int experts_per_token = 0;
  float routed_scaling_factor = 1.0f;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // Expert parallel: this rank holds routed experts [first_expert, first_expert +
  // mlp.experts.size()) and adds only their contributions (routing still ranks all num_experts);
  // the other experts' come from their ranks' outputs in the all-reduce that follows.
  int first_expert = 0;
  // false: out = routed * routed_scaling_factor only, without the shared expert (mlp.gate/up/down
  // may be undefined). Data-parallel attention adds the shared expert on the token's own rank,
  // while the routed experts' sum is combined over the expert-parallel ranks.
  bool add_shared = true;
};

// The shape of a step whose run ops a backend may record once and replay (CUDA graphs). Equal
// keys promise the same op sequence with the same by-value arguments on the same tensors; only the
// contents of the planned metadata (ids, positions, page tables, slots) differ between steps.
struct ReplayKey {
  const void* owner = nullptr;  // the model (one backend may run several)
  int num_tokens = 0;
  int num_seqs = 0;
  int logit_rows = 0;
  int64_t buffers_generation = 0;  // bumped by the owner whenever a tensor the ops use moves
  int64_t aux_generation = 0;      // the same for a second owner whose ops the step runs (a drafter)

  auto operator<=>(const ReplayKey&) const = default;
};

// The checks of the two indexer DCP ops' arguments that do not depend on the backend (ranks,
// shapes, the key tensors' dtypes) for a planned step of `tokens` tokens; m3::Error names the op.
// The backend checks the index queries' storage dtype and device itself.
void check_indexer_candidates_args(int tokens, const KvLayerView& cache, const Tensor& index_q_parts,
                                   int parts, const IndexerParams& params, int cp_size, int cp_rank,
                                   const Tensor& candidates);
void check_merge_candidates_args(int tokens, const Tensor& gathered, int cp_size, int parts, int part,
                                 const IndexerParams& params, const Tensor& selection);

// The checks of copy_kv_blocks' arguments every backend makes: U8 pool and host of whole blocks,
// every block and host slot in range. m3::Error names the copy.
void check_kv_block_copies(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies);

// The checks of the DSpark drafter's two ops that do not depend on the backend (uniform blocks,
// a window, a cache it can read; the heads' shapes and dtypes); m3::Error names the op. The second
// returns host views of the heads (valid on the CPU backend only: device pointers elsewhere).
void check_draft_block_args(const StepView& step, const KvLayerView& cache, int num_q_heads, int block_len, int window);
MarkovHeadView check_markov_drafts_args(const StepView& step, int num_logit_rows, const Tensor& base_logits,
                                        const Tensor& normed, const MarkovHeadWeights& head, int block_len);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // Called once by the model before any other op. Throws m3::Error for a geometry or numerics
  // the backend cannot run, naming it.
  virtual void configure(const BackendConfig& config) = 0;
  virtual DType activation_dtype() const = 0;
  // The element type of tensors alloc() returns for activations (F32 on the CPU).
  virtual DType activation_storage_dtype() const = 0;

  // A zero-filled tensor on the device. Activations: alloc({rows, cols}, activation_storage_dtype()).
  // Also used for the KV pool (U8) and index selections (I32).
  virtual Tensor alloc(Shape shape, DType dtype) = 0;
  // Copies a device tensor of activations (any storage dtype) to host fp32.
  virtual void copy_to_host_f32(const Tensor& src, float* dst) = 0;
  // A host tensor on the backend's device, bytes as they are (weights keep their formats; inputs
  // of op checks). The CPU backend returns `host` itself. `what` names it in errors (out of memory).
  virtual Tensor to_device(const Tensor& host, std::string_view what) = 0;

  // ---- plan: once per step ----
  // Stores the step's metadata and computes RoPE cos/sin for its positions (fp32, as
  // MiniMaxM3VLRotaryEmbedding: cos(pos * inv_freq) * attention_factor over config.rope.rotary_dim
  // channels). The batch must stay alive and unchanged until the step's last op returns.
  virtual void plan(const StepBatch& batch) = 0;
  // The planned step as kernels read it (host pointers on the CPU, device copies on the GPU).
  virtual StepView planned_step() const = 0;
  // Runs `body` (the run ops of the planned step, no synchronisation inside) for a step of shape
  // `key`. A backend may record the body's ops on one call and replay them on later calls of an
  // equal key after plan() instead of calling body (CUDA: graphs); it decides per planned step
  // whether it can (the CUDA backend: uniform decode batches). Default: body().
  virtual void run_replayable(const ReplayKey& key, const std::function<void()>& body) {
    (void)key;
    body();
  }

  // ---- run ops (rows = planned tokens unless stated) ----
  // out[t] = table[token_ids[t] - first_id] when that row exists, else zeros: a vocab-parallel
  // rank holds rows [first_id, first_id + table rows) of the embedding, and the all-reduce of the
  // ranks' outputs gives every token its one row. table [rows, hidden] F32, BF16 (or F16 on CUDA).
  virtual void embed(const Tensor& table, int64_t first_id, Tensor out) = 0;
  // out[r] = x[src_rows[r]] for r < n: gathers the planned logits_rows (for the final norm/head).
  virtual void gather_logits_rows(const Tensor& x, Tensor out) = 0;
  // Gemma RMSNorm per row: out = x * rsqrt(mean(x^2) + eps) * (1 + w), fp32; w F32 [cols].
  // out may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;
  // out [rows, out_features] = x [rows, in_features] W^T, any WeightFormat, dequantized exactly.
  virtual void linear(const Tensor& x, const LinearWeight& weight, Tensor out) = 0;
  // Several linear layers over one input (the attention projections): outputs[i].out =
  // x outputs[i].weight^T, each within linear()'s tolerance of linear() (the fp32 summation order
  // may differ). A backend may run them as one launch (the CUDA backend does for decode-sized
  // steps whose weights share a quantized format); the default runs them one by one.
  virtual void linears(const Tensor& x, std::span<const LinearOutput> outputs) {
    for (const LinearOutput& o : outputs) linear(x, *o.weight, o.out);
  }
  // In place on x [T, num_heads * head_dim]: per head, Gemma RMSNorm over head_dim with `norm`
  // (F32 [head_dim]), then rotate-half RoPE over the first `rope_dims` channels (pairs c and
  // c + rope_dims/2) with the planned cos/sin truncated to rope_dims channels (the indexer's
  // `cos[..., :index_head_dim]`); the other channels pass through. rope_dims may be 0.
  virtual void head_norm_rope(Tensor x, int num_heads, int head_dim, const Tensor& norm, float eps,
                              int rope_dims) = 0;
  // ops/attention.h kv_insert: k, v [T, Hkv * D]; index_k [T, Di] or an undefined Tensor.
  virtual void kv_insert(const KvLayerView& cache, const Tensor& k, const Tensor& v,
                         const Tensor& index_k) = 0;
  // The attention input path in one op: head_norm_rope of q (num_q_heads, q_norm) and of k
  // (cache.num_kv_heads, k_norm) over rope_dims, of index_k (one head, index_k_norm) and of the
  // index queries (index_heads, index_q_norm) over index_rope_dims when defined, then
  // kv_insert(cache, k, v, index_k). Same results as those calls (q, k, index_k and index_q are
  // left normed and roped); backends may fuse it (CUDA: one launch).
  virtual void attention_input(const KvLayerView& cache, const AttentionInputs& in) {
    head_norm_rope(in.q, in.num_q_heads, cache.head_dim, in.q_norm, in.eps, in.rope_dims);
    head_norm_rope(in.k, cache.num_kv_heads, cache.head_dim, in.k_norm, in.eps, in.rope_dims);
    if (in.index_k.defined())
      head_norm_rope(in.index_k, 1, cache.index_dim, in.index_k_norm, in.eps, in.index_rope_dims);
    if (in.index_q.defined())
      head_norm_rope(in.index_q, in.index_heads, cache.index_dim, in.index_q_norm, in.eps, in.index_rope_dims);
    kv_insert(cache, in.k, in.v, in.index_k);
  }
  // ops/attention.h indexer_topk: index_q [T, Hi * Di] -> selection I32 [T, Hi, topk_blocks].
  virtual void indexer_topk(const KvLayerView& cache, const Tensor& index_q,
                            const IndexerParams& params, Tensor selection) = 0;
  // Indexer decode context parallelism (ops/attention.h "Indexer DCP"), for tensor-parallel runs
  // where every rank holds the whole index-K cache. Per sparse layer on rank r of a cp group of
  // cp_size (the TP group; parts = its size, part = r), with Hl = params.index_heads the heads of
  // one rank (the IndexerParams of its indexer_topk):
  //   comm.all_gather(index_q [T, Hl*Di], index_q_parts [parts*T, Hl*Di]);
  //   indexer_topk_candidates(cache, index_q_parts, parts, params, cp_size, r, candidates);
  //   comm.all_gather(candidates [parts, T, Hl, topk], gathered [cp_size, parts, T, Hl, topk]);
  //   merge_topk_candidates(gathered, cp_size, parts, r, params, selection [T, Hl, topk]);
  // and selection holds the set of block ids indexer_topk(cache, index_q, params) gives on r,
  // bit for bit where both score alike (ops/attention.h says where: the CPU backend does).
  //
  // index_q_parts: part p's rows p*T .. p*T+T-1 hold global index heads p*Hl .. p*Hl+Hl-1 (an
  // activation tensor, queries as indexer_topk reads them). Writes candidates (I64, numel
  // parts*T*Hl*topk): per (part, token, head) the packed keys of the k best blocks b with
  // b % cp_size == cp_rank, descending, then 0.
  virtual void indexer_topk_candidates(const KvLayerView& cache, const Tensor& index_q_parts, int parts,
                                       const IndexerParams& params, int cp_size, int cp_rank,
                                       Tensor candidates) = 0;
  // gathered (I64, numel cp_size*parts*T*Hl*topk: every rank's candidates, rank 0 first) ->
  // selection I32 [T, Hl, topk] of part `part`: the block ids of the k largest keys, ascending,
  // then -1 padding.
  virtual void merge_topk_candidates(const Tensor& gathered, int cp_size, int parts, int part,
                                     const IndexerParams& params, Tensor selection) = 0;
  // ops/attention.h paged_attention: q [T, Hq * D] -> out [T, Hq * D]; selection I32
  // [T, Hkv, topk] or undefined (all blocks: full-attention layers).
  virtual void paged_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads,
                               const Tensor& selection, int topk, float sm_scale, Tensor out) = 0;
  // The DSpark drafter's attention (ops/attention.h draft_block_attention): the planned step is
  // blocks of block_len queries, one block per sequence (T = num_seqs * block_len); each query
  // reads its sequence's cached context within `window` positions and every key of its block
  // (block_k, block_v [T, Hkv * D] activations, non-causal). q [T, Hq * D] -> out [T, Hq * D].
  virtual void draft_block_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& block_k,
                                     const Tensor& block_v, int block_len, int window, float sm_scale, Tensor out) = 0;
  // The DSpark drafter's heads, greedy (ops/draft_heads.h), over the planned step's logits rows in
  // blocks of block_len, one block per sequence (L = num_seqs * block_len logits rows: the first
  // block_len queries of each sequence, the drafts it wants): base_logits [L, vocab] and normed
  // [L, hidden] activations; the anchor of block s is the planned token id of its first logits row.
  // ids[s * block_len + j] (draft j of block s) and confidence[...] in host memory, L each. Like
  // sample(), it ends a step: it waits for the device.
  virtual void markov_drafts(const Tensor& base_logits, const Tensor& normed, const MarkovHeadWeights& head,
                             int block_len, int32_t* ids, float* confidence) = 0;
  // SwiGLU-OAI MLP (dense layers, shared experts): out = down((clamp(up)+1) * g * sigmoid(alpha*g)),
  // g = min(gate, limit), up clamped to [-limit, limit].
  virtual void swiglu_mlp(const Tensor& x, const LinearWeight& gate, const LinearWeight& up,
                          const LinearWeight& down, float alpha, float limit, Tensor out) = 0;
  // The MoE block: sigmoid router (fp32 weight), top-k of p + e_score_correction_bias (ties to the
  // lower expert id), weights = chosen p normalised to sum 1, routed = sum_k w_k expert_k(x) over
  // the chosen experts this rank holds (MoeParams::first_expert), out = routed *
  // routed_scaling_factor + shared_expert(x) (mlp.gate/up/down; without it when
  // MoeParams::add_shared is false).
  virtual void moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) = 0;
  // The columns of a split axis put back together (vocab-parallel logits after their all-gather):
  // parts [num_parts * rows, w] (part p's rows [p * rows, (p + 1) * rows)) -> out [rows, cols],
  // out[r, p * w + c] = parts[p * rows + r, c] for p * w + c < cols <= num_parts * w (the columns
  // past cols are padding and dropped). Activation tensors.
  virtual void concat_column_parts(const Tensor& parts, int num_parts, Tensor out) = 0;
  // x += y (the residual add; rounded to the activation dtype).
  virtual void add_inplace(Tensor x, const Tensor& y) = 0;
  // The residual add and the norm that follows it: add_inplace(x, y), then rms_norm(x, weight,
  // eps, out), with the same results. out may alias y. Backends may fuse it (CUDA: one kernel).
  virtual void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) {
    add_inplace(x, y);
    rms_norm(x, weight, eps, out);
  }

  // ---- KV offload: whole pool blocks to and from the host tier (ops/kv_layout.h KvBlockCopy) ----
  // Host memory for offloaded KV blocks (U8, `bytes`), memory the copies below can move blocks to
  // and from without staging (CUDA: pinned, cudaHostAlloc). `what` names it in errors.
  // Default: m3::Error (a backend without a host tier).
  virtual Tensor alloc_kv_host_tier(int64_t bytes, std::string_view what);
  // Copies blocks of `block_bytes` between `pool` and `host` as ops/kv_layout.h KvBlockCopies
  // says, after every op queued before: ops queued after wait for copies.to_host and to_device
  // and for every copy of batch copies.wait_for_batch and before, not for copies.to_host_ahead.
  // The host does not wait for them (CUDA: a copy stream ordered with events; the CPU copies at
  // once). Default: m3::Error.
  virtual void copy_kv_blocks(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies);
  // Seconds spent in block copies so far, to host and to device (those known to have finished;
  // CUDA: timed with events on the copy stream). Default: zeros.
  virtual KvCopyTimes kv_copy_times() const { return {}; }

  // ---- the memory system ----
  // Bytes read plus bytes written per second by a copy of `bytes` within the backend's own memory
  // (far larger than its caches), the best of `repeats` timed copies after one untimed copy: the
  // rate a memory-bound step's floor is counted at (m3serve bench latency). The same count as the
  // "copy 4.2 TB/s" of an H200. CPU: the OpenMP threads of its loops copying host memory; CUDA: a
  // device-to-device copy timed with events, its buffers cut to a quarter of the free memory each.
  // Default: m3::Error.
  virtual double measure_copy_rate(int64_t bytes, int repeats);

  // ---- sampling: ends the step ----
  // Samples every row of `batch` (ops/sampling.h semantics) from logits [rows, vocab] as the head
  // wrote them (activation storage dtype), ids[i] for batch.rows[i] in host memory, then answers
  // every row of batch.logprobs, logprobs[j] for batch.logprobs[j] (null when there are none). The
  // one op that waits for the device (the step's single synchronisation: only the ids and the
  // logprobs come back). Default: copy the rows to the host and run the reference (backends
  // override it).
  virtual void sample(const Tensor& logits, const SampleBatch& batch, int32_t* ids, RowLogprobs* logprobs);
};

}  // namespace m3
