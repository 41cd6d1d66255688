// Internal interface between the CUDA backend (host, cuda_backend.cc) and its kernels (*.cu): plain
// argument structs and launch functions. Launchers only enqueue work on the given stream (no
// allocation, no synchronisation), so every op of a step can be captured in a CUDA graph.
//
// Activations are bf16 (uint16_t bits) rows; accumulation is fp32. Every kernel rounds its outputs
// to bf16 at the points where the CPU reference (kernels/cpu) rounds in bf16 mode, with the same
// intermediate roundings, so that the two backends differ only by fp32 summation order.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/attention.h"
#include "ops/kv_layout.h"
#include "ops/sampling.h"

namespace m3::cuda::detail {

// ---- weights ----

// How one linear layer's weight is stored on the device (model/weights.h WeightFormat, with the
// dense dtype folded in).
enum class WeightKind : uint8_t { kBF16, kF16, kF32, kFp8, kFp8Block, kMxfp8, kNvfp4 };

// A device view of one LinearWeight (rows = output features).
struct WeightView {
  const uint8_t* data = nullptr;   // codes or values, row stride row_bytes
  const uint8_t* scale = nullptr;  // kMxfp8 UE8M0 / kNvfp4 E4M3 bytes, kFp8Block F32, kFp8 F32[1]
  int64_t row_bytes = 0;
  int64_t scale_stride = 0;  // scale entries per scale row (bytes, or floats for kFp8Block)
  WeightKind kind = WeightKind::kBF16;
  // Second-level NVFP4 scale: the fp32 dot product is multiplied by out_mul (ModelOpt
  // weight_scale_2) or divided by out_div (compressed-tensors weight_global_scale; 0 = none).
  float out_mul = 1.0f;
  float out_div = 0.0f;
};

// One tile of rows that a linear kernel computes against one weight (one expert).
struct LinearItem {
  int32_t expert;
  int32_t row_begin;  // first row in the item space (the permuted rows for MoE)
  int32_t row_count;
  int32_t pad;
};

enum class Epilogue : uint8_t {
  kStore,   // out = bf16(x W^T)
  kSwiglu,  // out = SwiGLU-OAI(bf16(x Wg^T), bf16(x Wu^T)) with the reference's bf16 roundings
};

// One weight of a multi-output linear launch (LinearArgs::seg): its 16-feature slices follow the
// previous segment's in the skinny / streamed kernels' grid from slice_begin on, its 128-feature
// tiles in the wgmma kernel's blockIdx.x from tile_begin on.
struct LinearSegment {
  WeightView w;
  uint16_t* out = nullptr;
  int64_t out_stride = 0;
  int n = 0;  // output features
  int slice_begin = 0;
  int tile_begin = 0;
};
// The 128-feature tiles of a wgmma CTA (kStore; a SwiGLU CTA takes 64 gate and 64 up rows).
inline constexpr int kWgmmaTileFeatures = 128;
inline constexpr int kMaxLinearSegments = 6;

// out[r] = epilogue(x[src(r)] . W^T) for the rows of every item. Dense: items are the row tiles
// [i * item_rows, ...) of `rows` rows and weight w[0] (w[1]: the up projection of kSwiglu).
// Grouped (MoE): items[0 .. *num_items) from the device, weights table[j][item.expert], at most
// max_items items. src(r) = x_rows ? x_rows[r] : r.
struct LinearArgs {
  const uint16_t* x = nullptr;
  int64_t x_stride = 0;  // elements
  const int32_t* x_rows = nullptr;
  int rows = 0;
  int n = 0;  // output features
  int k = 0;  // input features
  WeightView w[2];
  const WeightView* table[2] = {nullptr, nullptr};
  const LinearItem* items = nullptr;
  const int32_t* num_items = nullptr;
  int max_items = 0;
  int item_rows = 16;  // rows per item: 16, 32 or 64 (streamed / skinny kernels, grouped 64: wgmma), 256 or 320 (wgmma)
  uint16_t* out = nullptr;
  int64_t out_stride = 0;
  Epilogue epilogue = Epilogue::kStore;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // num_segments > 0: several weights of one kind over the same x in one launch (dense, kStore;
  // Backend::linears). w[0], n and out are then taken per segment; w[0] here names the shared
  // kind for the dispatch.
  LinearSegment seg[kMaxLinearSegments];
  int num_segments = 0;
  // Grouped: every view of table[] passes streamed_weight_ok (the host checked them all).
  bool table_streamed_ok = false;
  // Dense launches on the wgmma kernel: K split over this many CTAs of a cluster (1-8); 0, the
  // launcher's own choice (linear_wgmma.cu, wgmma_k_splits). Set by benchmarks' split-K sweeps only.
  int k_splits = 0;
  // Grouped launches of 256- or 320-row items (prefill): items of at most this many rows (> 0) are the
  // streamed kernel's, which skips the others (their units are empty), and the wgmma kernel skips
  // them (launch_linear splits such a list in two; 0: one kernel takes every item).
  int streamed_items_up_to = 0;
  // The item list (items, num_items) and x_rows were complete before the kernel launched just
  // before this one began (the routed experts' launches at decode, with a launch between them and
  // the routing), so the streamed kernel may stream weights before that kernel ends (launch.cuh).
  // Dense launches without x_rows need no flag.
  bool schedule_ready = false;
};

// True when the tensor-core kernels take this weight (exact bf16 expansion, aligned rows);
// otherwise launch_linear uses the exact fp32 SIMT kernel.
bool linear_has_mma_path(const WeightView& w, int k);
// Rows per item the kernels prefer for a problem of `rows` rows (dense) or of about `rows` rows
// per expert (grouped). weight_rows: the weight rows a dense launch multiplies (out features;
// twice that for a SwiGLU pair; 0 where only the skinny and streamed kernels may run, as for the
// segments of one fused launch).
int linear_item_rows(const WeightView& w, int k, int weight_rows, int rows, bool grouped = false);
// Rows per item in batch-invariant mode (CudaBackendOptions::batch_invariant), whatever the row
// count: the item size picks the skinny kernel's instance, and with it the order in which a row's
// K chunks are summed (chunks per warp batch, accumulator sets) and whether K is split over a
// cluster (64-row items only) or the wgmma kernel runs (256). 16-row items: one fixed order per
// row, no split-K, and the decode shapes run as they do without the mode.
inline constexpr int kBatchInvariantItemRows = 16;
cudaError_t init_linear_kernels();
// The streamed kernel (linear_streamed.cu: persistent CTAs, weight stages by cp.async) takes
// 16-row items when every weight passes streamed_weight_ok; launch_linear dispatches there.
bool streamed_weight_ok(const WeightView& w);
bool streamed_linear_ok(const LinearArgs& args);
cudaError_t init_linear_streamed_kernels();
cudaError_t launch_linear_streamed(const LinearArgs& args, int max_items, cudaStream_t stream);
cudaError_t launch_linear(const LinearArgs& args, cudaStream_t stream);
// The prefill-shaped kernel (items of up to 256 rows, or 320 for grouped NVFP4 lists; Hopper
// wgmma; linear_wgmma.cu), for weights with a tensor-core path (linear_has_mma_path); launch_linear
// dispatches here. `items`: item count.
inline constexpr int kWgmmaItemRows = 256;
inline constexpr int kWgmmaWideItemRows = 320;
// The largest item the wgmma kernel takes for a weight kind: 320 rows for NVFP4 (both epilogues),
// 256 for the rest (MXFP8's SwiGLU instance would spill at 320, bf16's stages would not fit in
// shared memory). Only grouped lists (the routed experts) use 320: there an expert of 257-320
// rows is one item instead of a full one and a tail of a few rows (the 8,192-token MoE op 3%
// faster on an H100), while dense launches of 320-row items measured 6-29% slower than of 256
// (session 46: per item, not per tail), so dense launches keep 256.
constexpr int wgmma_max_item_rows(WeightKind kind) {
  return kind == WeightKind::kNvfp4 ? kWgmmaWideItemRows : kWgmmaItemRows;
}
// Whether launch_linear gives a tensor-core problem to the wgmma kernel: items of more than 64
// rows, and grouped (routed-expert) items of 64 rows, which its 64-row size takes two CTAs an SM
// (experts of 33-64 rows, e.g. M3.1's 128 experts at 1,025-2,048 tokens a step). Dense launches
// of up to 64 rows reach it with kWgmmaItemRows (linear_item_rows: wide layers at decode batches
// of 33-64, which launch_linear_wgmma runs on the 64-row size); 16-, 32- and 64-row dense items
// are the streamed and skinny kernels'.
inline bool linear_runs_wgmma(const LinearArgs& a) {
  return a.item_rows > 64 || (a.items != nullptr && a.item_rows == 64);
}
cudaError_t init_linear_wgmma_kernels();
cudaError_t launch_linear_wgmma(const LinearArgs& args, int items, cudaStream_t stream);
// Split-K for a dense wgmma launch of 256-row items whose 128-feature tiles leave SMs idle (decode
// batches of 33-256 rows: M3.1's o_proj has 48 tiles for 132 SMs, its fused attention projections
// 77, and one CTA walks every K step of its tile). A CTA's K step costs about the same whatever the
// split (the chain of one step's waits, docs/gpu-backend-notes.md "Session 30"), so a launch takes
// about waves x (steps a split + kWgmmaSplitFixedSteps), the fixed part pricing a CTA's pipeline
// fill and its share of the cluster's reduction. Waves count the clusters of s CTAs that fit at
// once (cudaOccupancyMaxActiveClusters: a cluster sits in one GPC, so 132 SMs hold fewer than
// 132 / s clusters of s CTAs; an H100 holds 39 of 3). The count of least time wins, 1 to
// kWgmmaMaxKSplits with at least kWgmmaMinSplitSteps steps a split, ties to fewer. Until session 37
// the rule kept the grid to one wave, which left the fused projections' 77 tiles unsplit at 96
// steps a CTA (`backend_check bench --only split` sweeps every count against the rule).
inline constexpr int kWgmmaMaxKSplits = 8;  // the portable cluster size
inline constexpr int kWgmmaMinSplitSteps = 12;
inline constexpr int kWgmmaSplitFixedSteps = 8;
// fit[s - 1] (s = 1 .. counts): the clusters of s CTAs that fit at once (a count with fit <= 0, or
// past counts, is not taken). Host code, tested without a GPU (linear_dispatch_test).
int wgmma_split_count(int64_t ctas, int k_tiles, const int* fit, int counts);

// ---- elementwise and normalisation ----

// cos/sin tables [T, rotary_dim / 2] (fp32, rounded to bf16 like the reference's cast):
// cos(pos * inv_freq[i]) * attention_factor.
cudaError_t launch_rope_tables(const int32_t* positions, int num_tokens, const float* inv_freq,
                               int half, float attention_factor, float* cos, float* sin,
                               cudaStream_t stream);
// out[t] = table[ids[t]] as bf16; table_dtype: 0 bf16, 1 f32 (rounded), 2 f16 (rounded).
// Rows outside [first_id, first_id + rows) of the table give zeros (vocab-parallel ranks).
cudaError_t launch_embed(const void* table, int table_dtype, int64_t rows, int64_t hidden, int64_t first_id,
                         const int32_t* ids,
                         int num_tokens, uint16_t* out, cudaStream_t stream);
// out[r] = x[rows[r]] for r < n.
cudaError_t launch_gather_rows(const uint16_t* x, const int32_t* rows, int n, int64_t cols,
                               uint16_t* out, cudaStream_t stream);
// Gemma RMSNorm of each row; out may alias x.
cudaError_t launch_rms_norm(const uint16_t* x, const float* w, int rows, int cols, float eps,
                            uint16_t* out, cudaStream_t stream);
// Per head: Gemma RMSNorm then rotate-half RoPE over rope_dims channels (ops/backend.h).
struct HeadNormRopeArgs {
  uint16_t* x = nullptr;  // [T, heads * head_dim], in place
  int num_tokens = 0;
  int num_heads = 0;
  int head_dim = 0;
  const float* norm = nullptr;  // [head_dim]
  float eps = 1e-6f;
  int rope_dims = 0;
  const float* cos = nullptr;  // [T, rope_half] with rope_half = rotary_dim / 2
  const float* sin = nullptr;
  int rope_half = 0;
};
cudaError_t launch_head_norm_rope(const HeadNormRopeArgs& args, cudaStream_t stream);
// x = bf16(x + y), n elements.
cudaError_t launch_add(uint16_t* x, const uint16_t* y, int64_t n, cudaStream_t stream);
// launch_add then launch_rms_norm of x [rows, cols] into out, in one pass, bit for bit; out may
// alias x or y.
cudaError_t launch_add_rms_norm(uint16_t* x, const uint16_t* y, const float* w, int rows, int cols, float eps,
                                uint16_t* out, cudaStream_t stream);
// dst[i] = float(src[i]) for bf16 src.
cudaError_t launch_bf16_to_f32(const uint16_t* src, int64_t n, float* dst, cudaStream_t stream);

// ---- MoE ----

struct MoeRouteArgs {
  const uint16_t* x = nullptr;  // [T, hidden]
  int num_tokens = 0;
  int hidden = 0;
  const float* router = nullptr;  // [E, hidden]
  const float* bias = nullptr;    // [E] or null
  int num_experts = 0;
  int top_k = 0;
  // Expert parallel: routing ranks all num_experts, but only the choices of the held experts
  // [first_expert, first_expert + held_experts) get permuted rows and work items, and an item's
  // expert is the held index (expert - first_expert: the row of the rank's weight tables).
  int first_expert = 0;
  int held_experts = 0;  // num_experts when this rank holds them all
  float* logits = nullptr;  // scratch [T, E]
  // Outputs, per token the top_k choices in ascending expert id:
  int32_t* choice_expert = nullptr;  // [T, top_k]
  float* choice_weight = nullptr;    // [T, top_k], normalised router probabilities
  int32_t* choice_row = nullptr;     // [T, top_k] permuted row of the choice; -1: held elsewhere
  // The permutation: rows grouped by expert, and the work items over them.
  int32_t* row_token = nullptr;      // [T * min(top_k, held)] token of each permuted row
  int32_t* expert_count = nullptr;   // scratch [E]: rows per held expert (the router kernel zeroes it)
  LinearItem* items = nullptr;       // [max_items]
  int32_t* num_items = nullptr;      // [1]
  int item_rows = 16;
  int max_items = 0;
  // Batch-invariant mode: the router logits always take the decode-shaped kernel, whose sum for a
  // token does not depend on how many tokens the step has (the tensor-core one, above 256 tokens,
  // sums in another order).
  bool batch_invariant = false;
  // Steps of up to 16 tokens route in one launch whose last CTA runs the top-k and the scan; this
  // counter of arrived CTAs must be zero before the launch and is zero after it. Null: three
  // launches at every size.
  int32_t* done = nullptr;
};
cudaError_t launch_moe_route(const MoeRouteArgs& args, cudaStream_t stream);
// Up to this many tokens the router logits take the decode-shaped kernel (a CTA per expert and 8
// tokens, a few microseconds of work), above it the tensor-core one (prefill: hundreds).
inline constexpr int kMoeSmallRouterMaxTokens = 256;
// out[t] = bf16(bf16(routed_t * scale) + shared[t]) with routed_t the sum over the token's
// choices in ascending expert id of bf16(y[row] * weight), rounded after every add. Choices of
// row -1 (experts held elsewhere) add nothing and their y is never read; shared null (routed
// only): out[t] = bf16(routed_t * scale).
cudaError_t launch_moe_combine(const uint16_t* y, const int32_t* choice_row, const float* choice_weight,
                               int num_tokens, int top_k, int hidden, float routed_scale,
                               const uint16_t* shared, uint16_t* out, cudaStream_t stream);

// The routed experts' gate/up + SwiGLU: `a` as for launch_linear over the permuted rows, x with the
// row map r.row_token (after launch_moe_route). Where the launch takes the wgmma kernel
// (linear_runs_wgmma), the routed rows of x are first copied into `gathered` ([held rows, k], the
// permuted order; may be null) so that the GEMM reads contiguous rows, by TMA.
cudaError_t launch_moe_gate_up(LinearArgs a, const MoeRouteArgs& r, uint16_t* gathered, cudaStream_t stream);

// ---- attention, any geometry (the MSA kernels take the M3 shape) ----

// ops/attention.h kv_insert from bf16 rows; index_k may be null.
cudaError_t launch_generic_kv_insert(const StepView& step, const KvLayerView& cache,
                                     const uint16_t* k, const uint16_t* v, const uint16_t* index_k,
                                     cudaStream_t stream);
// ops/attention.h indexer_topk: selection [T, Hi, topk].
cudaError_t launch_generic_indexer_topk(const StepView& step, const KvLayerView& cache,
                                        const uint16_t* index_q, const IndexerParams& params,
                                        int32_t* selection, cudaStream_t stream);
// ops/attention.h indexer DCP, any geometry: the candidates of rank cp_rank's block slice,
// [parts, T, Hl, topk] I64 keys from index_q_parts bf16 [parts * T, Hl * Di], and the merge of
// gathered [cp_size, parts, T, Hl, topk] into part `part`'s selection [T, Hl, topk]
// (indexer_dcp.cu; bit for bit the CPU reference).
cudaError_t launch_indexer_topk_candidates(const StepView& step, const KvLayerView& cache,
                                           const uint16_t* index_q_parts, int parts, const IndexerParams& params,
                                           int cp_size, int cp_rank, int64_t* candidates, cudaStream_t stream);
cudaError_t launch_merge_topk_candidates(const StepView& step, const int64_t* gathered, int cp_size, int parts,
                                         int part, const IndexerParams& params, int32_t* selection,
                                         cudaStream_t stream);
// ops/attention.h paged_attention; selection null for full attention. out bf16 [T, Hq * D].
cudaError_t launch_generic_attention(const StepView& step, const KvLayerView& cache,
                                     const uint16_t* q, int num_q_heads, const int32_t* selection,
                                     int topk, float sm_scale, uint16_t* out, cudaStream_t stream);

// ops/backend.h draft_block_attention (the DSpark drafter): q, block_k, block_v, out bf16. The
// tiled kernel (keys split over CTAs, then merged) needs `scratch` of
// draft_attention_scratch_floats() floats (0: the geometry takes the simple kernel, one CTA per
// token and KV head); with less it runs the simple kernel. splits / split_keys (may be null): the
// key splits per block and KV head and the keys of each.
size_t draft_attention_scratch_floats(const StepView& step, const KvLayerView& cache, int num_q_heads, int block_len,
                                      int window, int sm_count, int* splits = nullptr, int* split_keys = nullptr);
cudaError_t launch_draft_block_attention(const StepView& step, const KvLayerView& cache, const uint16_t* q,
                                         int num_q_heads, const uint16_t* block_k, const uint16_t* block_v,
                                         int block_len, int window, float sm_scale, uint16_t* out, float* scratch,
                                         size_t scratch_floats, int sm_count, cudaStream_t stream);
// ops/backend.h markov_drafts (ops/draft_heads.h, greedy): block_len launches of the argmax scan
// (keys: u64 scratch [rows], one candidate per row, zeroed first), then the ids and confidences.
struct MarkovDraftArgs {
  const uint16_t* base = nullptr;    // bf16 [rows, vocab]
  const uint16_t* normed = nullptr;  // bf16 [rows, hidden]
  const float* w1 = nullptr;         // [vocab, rank]
  const float* w2 = nullptr;
  const float* confidence_w = nullptr;
  float confidence_b = 0.0f;
  bool confidence_with_markov = true;
  int64_t vocab = 0;
  int rank = 0;
  int64_t hidden = 0;
  const int32_t* token_ids = nullptr;    // the planned ids
  const int32_t* logits_rows = nullptr;  // the planned logits rows: token_ids[logits_rows[s * block_len]] is block s's anchor
  int num_blocks = 0;
  int block_len = 0;
  unsigned long long* keys = nullptr;
  int32_t* ids = nullptr;
  float* confidence = nullptr;
};
// Ranks up to kMarkovMaxRank (the shared memory of a w2 tile and the blocks' w1 rows).
inline constexpr int kMarkovMaxRank = 512;
cudaError_t launch_markov_drafts(const MarkovDraftArgs& args, cudaStream_t stream);

// The fused attention input path: per token, head norm + RoPE of q (in place), of k and of
// index-K, and the quantized write of k, v and index-K into the cache. k and index_k are also
// left normed and roped in place, as the separate ops leave them.
struct AttentionInputArgs {
  StepView step;
  KvLayerView cache;
  uint16_t* q = nullptr;
  int num_q_heads = 0;
  uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  uint16_t* index_k = nullptr;  // null: no index cache write
  uint16_t* index_q = nullptr;  // [T, index_heads, index_dim]; null: none
  int index_heads = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* index_k_norm = nullptr;
  const float* index_q_norm = nullptr;
  float eps = 1e-6f;
  int rope_dims = 0;
  int index_rope_dims = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int rope_half = 0;
};
cudaError_t launch_attention_input(const AttentionInputArgs& args, cudaStream_t stream);

// ---- sampling (sampling.cu) ----

// A cluster of CTAs per row of `rows` (sampling_row.cuh) samples it from the bf16 logits (ops/sampling.h semantics) into out.
struct SampleArgs {
  const uint16_t* logits = nullptr;  // bf16 [*, vocab]; row r.logits_row
  int vocab = 0;
  const SampleRow* rows = nullptr;
  int num_rows = 0;
  const int32_t* ids = nullptr;        // SampleBatch::ids
  const int32_t* counts = nullptr;     // SampleBatch::counts
  const float* biases = nullptr;       // SampleBatch::biases (null when no row has a logit bias)
  const int32_t* work_slot = nullptr;  // [num_rows] row of `work` for rows with a mask, bias, penalties or allowed mask, else -1
  float* work = nullptr;               // [slots, vocab] fp32 copies of those rows
  const uint32_t* allowed = nullptr;   // SampleBatch::allowed: [mask rows, allowed_words] bitmasks
  int allowed_words = 0;
  int32_t* out = nullptr;              // [num_rows] sampled ids
};
cudaError_t launch_sample(const SampleArgs& args, cudaStream_t stream);

// Logprobs of SampleBatch::logprobs (ops/sampling.h RowLogprobs), a cluster of CTAs per row, after the draw.
struct LogprobArgs {
  const uint16_t* logits = nullptr;  // bf16 [*, vocab]; row q.logits_row
  int vocab = 0;
  const LogprobRow* rows = nullptr;
  int num_rows = 0;
  const int32_t* drawn = nullptr;  // the batch's sampled ids (SampleArgs::out), for LogprobRow::drawn_by
  RowLogprobs* out = nullptr;      // [num_rows]
};
cudaError_t launch_logprobs(const LogprobArgs& args, cudaStream_t stream);

}  // namespace m3::cuda::detail
