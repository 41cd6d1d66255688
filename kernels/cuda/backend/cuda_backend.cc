// The CUDA backend: ops/backend.h on the device, one stream, bf16 activations.
//
// The MoE op forks a second stream for the shared expert (moe()): the only work that leaves
// stream_, joined back before the op's last kernel, so every op still completes in stream order
// (and a captured step is one graph with two parallel branches inside each MoE layer).
//
// plan() uploads the step's metadata in one async copy from pinned memory, computes the RoPE
// tables on the device and plans the MSA kernels; the run ops only enqueue kernels (no allocation
// once the scratch buffers have grown to the step sizes seen, no synchronisation), except
// copy_to_host_f32, which waits for the stream.
#include "kernels/cuda/backend/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/log.h"
#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/cublas_gemm.h"
#include "kernels/cuda/backend/cuda_graphs.h"
#include "kernels/cuda/backend/device_memory.h"
#include "kernels/cuda/backend/kv_block_copier.h"
#include "kernels/cuda/msa.h"

namespace m3 {
namespace {

using cuda::check_cuda;
using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
namespace detail = cuda::detail;

const uint16_t* bf16_ptr(const Tensor& t) { return t.data_as<const uint16_t>(); }
uint16_t* bf16_ptr_mut(const Tensor& t) { return t.data_as<uint16_t>(); }

// Up to this many tokens the MoE block runs its shared expert in the main stream between the
// routed launches rather than on the side stream beside them (CudaBackend::moe).
constexpr int64_t kMoeInterleaveSharedMaxTokens = 1;

void check_act(const Tensor& t, int64_t rows, int64_t cols, const std::string& what) {
  M3_CHECK(t.defined() && t.device() == Device::kCuda && t.dtype() == DType::kBF16 && t.ndim() == 2 &&
               t.dim(0) == rows && t.dim(1) == cols,
           "cuda backend: {} must be a device BF16 [{}, {}] tensor, got {} {} on {}", what, rows, cols,
           t.defined() ? dtype_name(t.dtype()) : "undefined", shape_string(t.shape()),
           t.defined() ? device_name(t.device()) : "-");
}

void check_f32_vector(const Tensor& t, int64_t n, const char* what) {
  M3_CHECK(t.defined() && t.device() == Device::kCuda && t.dtype() == DType::kF32 && t.numel() == n,
           "cuda backend: {} must be a device F32 tensor of {} elements", what, n);
}

detail::WeightView weight_view(const LinearWeight& w) {
  M3_CHECK(w.weight.defined(), "linear {}: weight is not loaded", w.name);
  M3_CHECK(w.weight.device() == Device::kCuda,
           "linear {}: weight is in host memory (place the weights on the backend first: to_device / place_weights)", w.name);
  detail::WeightView v;
  v.data = w.weight.data_as<const uint8_t>();
  v.row_bytes = w.weight.dim(-1) * static_cast<int64_t>(dtype_size(w.weight.dtype()));
  if (w.scale.defined()) {
    v.scale = w.scale.data_as<const uint8_t>();
    v.scale_stride = w.scale.ndim() >= 2 ? w.scale.dim(-1) : 0;
  }
  switch (w.format) {
    case WeightFormat::kDense:
      if (w.weight.dtype() == DType::kBF16) v.kind = detail::WeightKind::kBF16;
      else if (w.weight.dtype() == DType::kF16) v.kind = detail::WeightKind::kF16;
      else if (w.weight.dtype() == DType::kF32) v.kind = detail::WeightKind::kF32;
      else fail("linear {}: dense weight of dtype {} is not supported", w.name, dtype_name(w.weight.dtype()));
      break;
    case WeightFormat::kFp8:
      v.kind = detail::WeightKind::kFp8;
      break;
    case WeightFormat::kFp8Block:
      v.kind = detail::WeightKind::kFp8Block;
      break;
    case WeightFormat::kMxfp8:
      v.kind = detail::WeightKind::kMxfp8;
      break;
    case WeightFormat::kNvfp4:
      v.kind = detail::WeightKind::kNvfp4;
      if (w.global_divisor != 0.0f) v.out_div = w.global_divisor;
      else v.out_mul = w.global_scale;
      break;
  }
  return v;
}

// Per-expert weight views of one MoE layer, on the device (built on the first call for a layer).
struct ExpertTables {
  DeviceBuffer views;  // [3][E] WeightView: gate, up, down of the experts the rank holds
  detail::WeightView first[3];
  bool streamed_ok = true;  // every view passes detail::streamed_weight_ok
  // What `views` holds, to tell a layer from another one allocated where a freed one was: every
  // view is compared (first and last pointers alone can coincide while the middle experts moved).
  std::vector<detail::WeightView> host_views;
};

bool same_view(const detail::WeightView& a, const detail::WeightView& b) {
  return a.data == b.data && a.scale == b.scale && a.row_bytes == b.row_bytes && a.scale_stride == b.scale_stride &&
         a.kind == b.kind && a.out_mul == b.out_mul && a.out_div == b.out_div;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : options_(options) {
    if (options.cuda_graphs)
      graphs_ = std::make_unique<cuda::GraphCache>(cuda::kGraphCacheSize, [this] { return scratch_generation(); });
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    check_cuda(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming), "event");
    check_cuda(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking), "side stream");
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "event");
    check_cuda(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "event");
    check_cuda(detail::init_linear_kernels(), "linear kernel attributes");
    gemm_ = std::make_unique<cuda::CublasLtGemm>();
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device), "SM count");
  }
  ~CudaBackend() override {
    kv_copier_.reset();  // waits for its copies, which the compute stream may wait on
    graphs_.reset();
    msa_.reset();
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (side_stream_) {
      cudaStreamSynchronize(side_stream_);
      cudaStreamDestroy(side_stream_);
    }
    if (upload_done_) cudaEventDestroy(upload_done_);
    if (fork_) cudaEventDestroy(fork_);
    if (join_) cudaEventDestroy(join_);
  }

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }

  void configure(const BackendConfig& config) override {
    M3_CHECK(config.activation_dtype == DType::kBF16,
             "cuda backend: activations are bfloat16 on the GPU (--dtype {} is CPU-only; use --dtype bfloat16)",
             dtype_name(config.activation_dtype));
    M3_CHECK(config.rotary_dim % 2 == 0 && config.rotary_dim <= config.head_dim &&
                 static_cast<int>(config.rope_inv_freq.size()) * 2 >= config.rotary_dim,
             "cuda backend: rotary_dim {} needs {} inverse frequencies (have {})", config.rotary_dim,
             config.rotary_dim / 2, config.rope_inv_freq.size());
    config_ = config;
    rope_half_ = std::max(1, config.rotary_dim / 2);
    inv_freq_.reserve(sizeof(float) * rope_half_, "rope inverse frequencies");
    std::vector<float> f(config.rope_inv_freq.begin(), config.rope_inv_freq.begin() + config.rotary_dim / 2);
    f.resize(rope_half_, 0.0f);
    check_cuda(cudaMemcpy(inv_freq_.as(), f.data(), sizeof(float) * rope_half_, cudaMemcpyHostToDevice), "inv_freq");
    msa_.reset();
    const int group = config.num_kv_heads > 0 ? config.num_q_heads / config.num_kv_heads : 0;
    const bool sparse = config.has_sparse_layers;
    const bool msa_shape = config.head_dim == 128 && config.block_size % 64 == 0 &&
                           config.block_size <= 256 && group >= 1 && group <= 16 &&
                           (!sparse || (config.index_dim == 128 && config.indexer.index_heads <= 64 &&
                                        config.indexer.topk_blocks <= 128));
    if (msa_shape) {
      cuda::MsaConfig mc;
      mc.num_q_heads = config.num_q_heads;
      mc.num_kv_heads = config.num_kv_heads;
      mc.head_dim = config.head_dim;
      mc.index_dim = sparse ? config.index_dim : 0;
      mc.block_size = config.block_size;
      mc.indexer = config.indexer;
      mc.dense = true;
      mc.batch_invariant = options_.batch_invariant;
      msa_ = std::make_unique<cuda::MsaPlan>(mc);
    }
    M3_LOG_DEBUG("cuda backend: attention on the {} kernels{}", msa_ ? "MSA" : "generic",
                 options_.batch_invariant ? ", batch-invariant" : "");
  }
  DType activation_dtype() const override { return DType::kBF16; }
  DType activation_storage_dtype() const override { return DType::kBF16; }

  Tensor alloc(Shape shape, DType dtype) override { return cuda::device_tensor(std::move(shape), dtype, "activation"); }

  Tensor to_device(const Tensor& host, std::string_view what) override {
    if (!host.defined() || host.device() == Device::kCuda) return host;
    const std::string name(what);
    Tensor d = cuda::device_tensor(host.shape(), host.dtype(), name.c_str());
    check_cuda(cudaMemcpy(d.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice), name.c_str());
    return d;
  }

  void copy_to_host_f32(const Tensor& src, float* dst) override {
    M3_CHECK(src.device() == Device::kCuda, "cuda backend: copy_to_host_f32 of a host tensor");
    const int64_t n = src.numel();
    if (src.dtype() == DType::kF32) {
      check_cuda(cudaMemcpyAsync(dst, src.data(), n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy to host");
    } else {
      M3_CHECK(src.dtype() == DType::kBF16, "cuda backend: copy_to_host_f32 of {}", dtype_name(src.dtype()));
      host_f32_.reserve(n * sizeof(float), "host copy staging");
      check_cuda(detail::launch_bf16_to_f32(bf16_ptr(src), n, host_f32_.as<float>(), stream_), "bf16 -> f32");
      check_cuda(cudaMemcpyAsync(dst, host_f32_.as(), n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                 "copy to host");
    }
    check_cuda(cudaStreamSynchronize(stream_), "copy to host");
  }

  void plan(const StepBatch& batch) override;
  StepView planned_step() const override { return step_; }

  // The host tier of the prefix cache: pinned memory, copies on their own stream (kv_block_copier.h).
  Tensor alloc_kv_host_tier(int64_t bytes, std::string_view what) override {
    return cuda::KvBlockCopier::alloc_host(bytes, what);
  }
  void copy_kv_blocks(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies) override {
    if (!kv_copier_) kv_copier_ = std::make_unique<cuda::KvBlockCopier>();
    kv_copier_->copy(pool, host, block_bytes, copies, stream_);
  }
  KvCopyTimes kv_copy_times() const override { return kv_copier_ ? kv_copier_->times() : KvCopyTimes{}; }
  double measure_copy_rate(int64_t bytes, int repeats) override;

  // Uniform decode steps planned in graph mode (graph_pages_ > 0) replay CUDA graphs.
  void run_replayable(const ReplayKey& key, const std::function<void()>& body) override {
    if (!graphs_ || graph_pages_ == 0) {
      body();
      return;
    }
    M3_CHECK(key.num_tokens == step_.num_tokens && key.num_seqs == step_.num_seqs && key.logit_rows == num_logit_rows_,
             "cuda backend: replay key ({} tokens, {} seqs, {} rows) is not the planned step ({}, {}, {})",
             key.num_tokens, key.num_seqs, key.logit_rows, step_.num_tokens, step_.num_seqs, num_logit_rows_);
    graphs_->run({key, graph_pages_}, stream_, body);
  }
  cudaStream_t stream() const { return stream_; }
  CudaGraphStats graph_stats() const {
    CudaGraphStats s;
    if (!graphs_) return s;
    const cuda::GraphCache::Stats& g = graphs_->stats();
    s.eager = g.eager;
    s.captures = g.captures;
    s.replays = g.replays;
    s.capture_failures = g.capture_failures;
    s.drops = g.drops;
    return s;
  }

  void embed(const Tensor& table, int64_t first_id, Tensor out) override {
    check_act(out, step_.num_tokens, table.dim(1), "embed output");
    M3_CHECK(table.device() == Device::kCuda, "embedding table is in host memory");
    int kind;
    if (table.dtype() == DType::kBF16) kind = 0;
    else if (table.dtype() == DType::kF32) kind = 1;
    else if (table.dtype() == DType::kF16) kind = 2;
    else fail("embedding table of dtype {} is not supported", dtype_name(table.dtype()));
    check_cuda(detail::launch_embed(table.data(), kind, table.dim(0), table.dim(1), first_id, token_ids_, step_.num_tokens, bf16_ptr_mut(out),
                                    stream_),
               "embed");
  }

  void concat_column_parts(const Tensor& parts, int num_parts, Tensor out) override {
    M3_CHECK(num_parts >= 1 && parts.dim(0) % num_parts == 0, "concat_column_parts: {} rows do not split in {} parts",
             parts.dim(0), num_parts);
    const int64_t rows = parts.dim(0) / num_parts, w = parts.dim(1), cols = out.dim(1);
    check_act(parts, rows * num_parts, w, "concat_column_parts input");
    check_act(out, rows, cols, "concat_column_parts output");
    M3_CHECK(cols <= num_parts * w, "concat_column_parts: {} columns from {} parts of {}", cols, num_parts, w);
    if (rows == 0) return;
    // One strided copy per part (graph-capturable, no kernel of ours).
    for (int p = 0; p < num_parts; ++p) {
      const int64_t width = std::min(w, cols - p * w);
      if (width <= 0) break;
      check_cuda(cudaMemcpy2DAsync(bf16_ptr_mut(out) + p * w, cols * 2, bf16_ptr(parts) + p * rows * w, w * 2,
                                   width * 2, rows, cudaMemcpyDeviceToDevice, stream_),
                 "concat_column_parts");
    }
  }

  void gather_logits_rows(const Tensor& x, Tensor out) override {
    check_act(out, num_logit_rows_, x.dim(1), "gathered rows");
    check_cuda(detail::launch_gather_rows(bf16_ptr(x), logits_rows_, num_logit_rows_, x.dim(1), bf16_ptr_mut(out), stream_),
               "gather rows");
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    const int64_t rows = x.dim(0), cols = x.dim(1);
    check_act(x, rows, cols, "rms_norm input");
    check_act(out, rows, cols, "rms_norm output");
    check_f32_vector(weight, cols, "rms_norm weight");
    check_cuda(detail::launch_rms_norm(bf16_ptr(x), weight.data_as<const float>(), static_cast<int>(rows),
                                       static_cast<int>(cols), eps, bf16_ptr_mut(out), stream_),
               "rms_norm");
  }

  void linear(const Tensor& x, const LinearWeight& weight, Tensor out) override { linear_on(x, weight, out, stream_); }
  // One skinny launch for decode-sized steps (<= 256 rows) when every weight has the same
  // quantized kind and the tensor-core path: the small projections (k, v, index q/k: 8-32
  // CTAs each) fill the GPU beside q_proj instead of running alone. Otherwise one by one.
  void linears(const Tensor& x, std::span<const LinearOutput> outputs) override {
    if (!fused_linears(x, outputs)) Backend::linears(x, outputs);
  }

  void head_norm_rope(Tensor x, int num_heads, int head_dim, const Tensor& norm, float eps, int rope_dims) override {
    check_act(x, step_.num_tokens, int64_t(num_heads) * head_dim, "head_norm_rope input");
    check_f32_vector(norm, head_dim, "head norm weight");
    M3_CHECK(rope_dims % 2 == 0 && rope_dims <= head_dim && rope_dims <= config_.rotary_dim,
             "rope over {} channels of {} (rotary_dim {})", rope_dims, head_dim, config_.rotary_dim);
    detail::HeadNormRopeArgs a;
    a.x = bf16_ptr_mut(x);
    a.num_tokens = step_.num_tokens;
    a.num_heads = num_heads;
    a.head_dim = head_dim;
    a.norm = norm.data_as<const float>();
    a.eps = eps;
    a.rope_dims = rope_dims;
    a.cos = rope_cos_.as<const float>();
    a.sin = rope_sin_.as<const float>();
    a.rope_half = rope_half_;
    check_cuda(detail::launch_head_norm_rope(a, stream_), "head_norm_rope");
  }

  void kv_insert(const KvLayerView& cache, const Tensor& k, const Tensor& v, const Tensor& index_k) override {
    const int64_t kv_cols = int64_t(cache.num_kv_heads) * cache.head_dim;
    check_act(k, step_.num_tokens, kv_cols, "K");
    check_act(v, step_.num_tokens, kv_cols, "V");
    if (index_k.defined()) check_act(index_k, step_.num_tokens, cache.index_dim, "index K");
    const uint16_t* ik = index_k.defined() ? bf16_ptr(index_k) : nullptr;
    if (msa_ && cache.kv_dtype != KvDType::kF32 && (ik == nullptr || cache.index_dtype != KvDType::kF32)) {
      msa_->kv_insert(cache, bf16_ptr(k), bf16_ptr(v), ik, stream_);
      return;
    }
    check_cuda(detail::launch_generic_kv_insert(step_, cache, bf16_ptr(k), bf16_ptr(v), ik, stream_), "kv_insert");
  }

  void attention_input(const KvLayerView& cache, const AttentionInputs& in) override {
    const int64_t kv_cols = int64_t(cache.num_kv_heads) * cache.head_dim;
    check_act(in.q, step_.num_tokens, int64_t(in.num_q_heads) * cache.head_dim, "Q");
    check_act(in.k, step_.num_tokens, kv_cols, "K");
    check_act(in.v, step_.num_tokens, kv_cols, "V");
    check_f32_vector(in.q_norm, cache.head_dim, "q_norm");
    check_f32_vector(in.k_norm, cache.head_dim, "k_norm");
    M3_CHECK(in.rope_dims % 2 == 0 && in.rope_dims <= cache.head_dim && in.rope_dims <= config_.rotary_dim,
             "rope over {} channels of {} (rotary_dim {})", in.rope_dims, cache.head_dim, config_.rotary_dim);
    if (in.index_k.defined() || in.index_q.defined())
      M3_CHECK(in.index_rope_dims % 2 == 0 && in.index_rope_dims <= cache.index_dim &&
                   in.index_rope_dims <= config_.rotary_dim,
               "index rope over {} channels of {}", in.index_rope_dims, cache.index_dim);
    detail::AttentionInputArgs a;
    if (in.index_k.defined()) {
      check_act(in.index_k, step_.num_tokens, cache.index_dim, "index K");
      check_f32_vector(in.index_k_norm, cache.index_dim, "index_k_norm");
      a.index_k = bf16_ptr_mut(in.index_k);
      a.index_k_norm = in.index_k_norm.data_as<const float>();
    }
    if (in.index_q.defined()) {
      M3_CHECK(in.index_heads > 0, "index Q without index heads");
      check_act(in.index_q, step_.num_tokens, int64_t(in.index_heads) * cache.index_dim, "index Q");
      check_f32_vector(in.index_q_norm, cache.index_dim, "index_q_norm");
      a.index_q = bf16_ptr_mut(in.index_q);
      a.index_q_norm = in.index_q_norm.data_as<const float>();
      a.index_heads = in.index_heads;
    }
    a.step = step_;
    a.cache = cache;
    a.q = bf16_ptr_mut(in.q);
    a.num_q_heads = in.num_q_heads;
    a.k = bf16_ptr_mut(in.k);
    a.v = bf16_ptr(in.v);
    a.q_norm = in.q_norm.data_as<const float>();
    a.k_norm = in.k_norm.data_as<const float>();
    a.eps = in.eps;
    a.rope_dims = in.rope_dims;
    a.index_rope_dims = in.index_rope_dims;
    a.cos = rope_cos_.as<const float>();
    a.sin = rope_sin_.as<const float>();
    a.rope_half = rope_half_;
    check_cuda(detail::launch_attention_input(a, stream_), "attention_input");
  }

  void indexer_topk(const KvLayerView& cache, const Tensor& index_q, const IndexerParams& params,
                    Tensor selection) override {
    check_act(index_q, step_.num_tokens, int64_t(params.index_heads) * cache.index_dim, "index Q");
    M3_CHECK(selection.dtype() == DType::kI32 && selection.device() == Device::kCuda &&
                 selection.numel() == int64_t(step_.num_tokens) * params.index_heads * params.topk_blocks,
             "selection must be a device I32 [{}, {}, {}]", step_.num_tokens, params.index_heads,
             params.topk_blocks);
    if (msa_ && cache.index_dtype != KvDType::kF32 && params.topk_blocks == config_.indexer.topk_blocks) {
      msa_->indexer_topk(cache, bf16_ptr(index_q), cuda::ActDType::kBF16, selection.data_as<int32_t>(), stream_);
      return;
    }
    check_cuda(detail::launch_generic_indexer_topk(step_, cache, bf16_ptr(index_q), params,
                                                   selection.data_as<int32_t>(), stream_),
               "indexer_topk");
  }

  void indexer_topk_candidates(const KvLayerView& cache, const Tensor& index_q_parts, int parts,
                               const IndexerParams& params, int cp_size, int cp_rank, Tensor candidates) override {
    check_indexer_candidates_args(step_.num_tokens, cache, index_q_parts, parts, params, cp_size, cp_rank,
                                  candidates);
    check_act(index_q_parts, index_q_parts.dim(0), index_q_parts.dim(1), "gathered index Q");
    M3_CHECK(candidates.device() == Device::kCuda, "cuda backend: candidates must be a device tensor");
    check_cuda(detail::launch_indexer_topk_candidates(step_, cache, bf16_ptr(index_q_parts), parts, params, cp_size,
                                                      cp_rank, candidates.data_as<int64_t>(), stream_),
               "indexer_topk_candidates");
  }

  void merge_topk_candidates(const Tensor& gathered, int cp_size, int parts, int part, const IndexerParams& params,
                             Tensor selection) override {
    check_merge_candidates_args(step_.num_tokens, gathered, cp_size, parts, part, params, selection);
    M3_CHECK(gathered.device() == Device::kCuda && selection.device() == Device::kCuda,
             "cuda backend: gathered candidates and selection must be device tensors");
    check_cuda(detail::launch_merge_topk_candidates(step_, gathered.data_as<const int64_t>(), cp_size, parts, part,
                                                    params, selection.data_as<int32_t>(), stream_),
               "merge_topk_candidates");
  }

  void paged_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& selection, int topk,
                       float sm_scale, Tensor out) override {
    const int64_t cols = int64_t(num_q_heads) * cache.head_dim;
    check_act(q, step_.num_tokens, cols, "Q");
    check_act(out, step_.num_tokens, cols, "attention output");
    const int32_t* sel = selection.defined() ? selection.data_as<const int32_t>() : nullptr;
    if (msa_ && cache.kv_dtype != KvDType::kF32 && (sel == nullptr || topk == config_.indexer.topk_blocks)) {
      msa_->attention(cache, bf16_ptr(q), cuda::ActDType::kBF16, sel, sm_scale, bf16_ptr_mut(out), nullptr, stream_);
      return;
    }
    check_cuda(detail::launch_generic_attention(step_, cache, bf16_ptr(q), num_q_heads, sel, topk, sm_scale,
                                                bf16_ptr_mut(out), stream_),
               "paged_attention");
  }

  void draft_block_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& block_k,
                             const Tensor& block_v, int block_len, int window, float sm_scale, Tensor out) override {
    check_draft_block_args(step_, cache, num_q_heads, block_len, window);
    const int64_t cols = int64_t(num_q_heads) * cache.head_dim, kv_cols = int64_t(cache.num_kv_heads) * cache.head_dim;
    check_act(q, step_.num_tokens, cols, "draft Q");
    check_act(block_k, step_.num_tokens, kv_cols, "draft block K");
    check_act(block_v, step_.num_tokens, kv_cols, "draft block V");
    check_act(out, step_.num_tokens, cols, "draft attention output");
    const size_t floats =
        detail::draft_attention_scratch_floats(step_, cache, num_q_heads, block_len, window, sm_count_);
    if (floats > 0) draft_attn_scratch_.reserve(floats * sizeof(float), "draft_block_attention splits");
    check_cuda(detail::launch_draft_block_attention(step_, cache, bf16_ptr(q), num_q_heads, bf16_ptr(block_k),
                                                    bf16_ptr(block_v), block_len, window, sm_scale, bf16_ptr_mut(out),
                                                    floats > 0 ? draft_attn_scratch_.as<float>() : nullptr, floats,
                                                    sm_count_, stream_),
               "draft_block_attention (at most 32 query heads per KV head, head_dim <= 256)");
  }

  void markov_drafts(const Tensor& base_logits, const Tensor& normed, const MarkovHeadWeights& head, int block_len,
                     int32_t* ids, float* confidence) override {
    const MarkovHeadView view = check_markov_drafts_args(step_, num_logit_rows_, base_logits, normed, head, block_len);
    check_act(base_logits, num_logit_rows_, view.vocab, "draft base logits");
    check_act(normed, num_logit_rows_, view.hidden, "draft normed rows");
    M3_CHECK(head.w1.device() == Device::kCuda && head.w2.device() == Device::kCuda &&
                 head.confidence_w.device() == Device::kCuda,
             "cuda backend: markov_drafts' heads must be device tensors");
    M3_CHECK(view.rank <= detail::kMarkovMaxRank, "cuda backend: markov_drafts of rank {} (at most {})", view.rank,
             detail::kMarkovMaxRank);
    const size_t rows = size_t(std::max(1, num_logit_rows_));
    markov_keys_.reserve(sizeof(unsigned long long) * rows, "markov_drafts keys");
    markov_out_.reserve(2 * sizeof(int32_t) * rows, "markov_drafts outputs");
    markov_out_pinned_.reserve(2 * sizeof(int32_t) * rows, "markov_drafts outputs (pinned)");
    detail::MarkovDraftArgs a;
    a.base = bf16_ptr(base_logits);
    a.normed = bf16_ptr(normed);
    a.w1 = view.w1;
    a.w2 = view.w2;
    a.confidence_w = view.confidence_w;
    a.confidence_b = view.confidence_b;
    a.confidence_with_markov = view.confidence_with_markov;
    a.vocab = view.vocab;
    a.rank = view.rank;
    a.hidden = view.hidden;
    a.token_ids = token_ids_;
    a.logits_rows = logits_rows_;
    a.num_blocks = num_logit_rows_ / block_len;
    a.block_len = block_len;
    a.keys = markov_keys_.as<unsigned long long>();
    a.ids = markov_out_.as<int32_t>();
    a.confidence = reinterpret_cast<float*>(a.ids + rows);
    check_cuda(detail::launch_markov_drafts(a, stream_), "markov_drafts");
    check_cuda(cudaMemcpyAsync(markov_out_pinned_.as(), markov_out_.as(), 2 * sizeof(int32_t) * rows,
                               cudaMemcpyDeviceToHost, stream_),
               "markov_drafts outputs");
    check_cuda(cudaStreamSynchronize(stream_), "markov_drafts");
    const int32_t* host = markov_out_pinned_.as<int32_t>();
    std::memcpy(ids, host, sizeof(int32_t) * num_logit_rows_);
    std::memcpy(confidence, host + rows, sizeof(float) * num_logit_rows_);
  }

  void swiglu_mlp(const Tensor& x, const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down,
                  float alpha, float limit, Tensor out) override {
    const int64_t rows = x.dim(0), inter = gate.out_features;
    check_act(x, rows, gate.in_features, "MLP input");
    check_act(out, rows, down.out_features, "MLP output");
    M3_CHECK(up.out_features == inter && down.in_features == inter,
             "MLP {}: gate/up/down shapes disagree ({} / {} / {})", gate.name, inter, up.out_features, down.in_features);
    mlp_act_.reserve(size_t(rows) * inter * 2, "MLP activation");
    gate_up_swiglu(bf16_ptr(x), x.dim(1), static_cast<int>(rows), gate, up, alpha, limit, mlp_act_.as<uint16_t>(),
                   stream_);
    Tensor act = Tensor::wrap(mlp_act_.as(), {rows, inter}, DType::kBF16, Device::kCuda);
    linear(act, down, out);
  }

  void moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) override;

  void add_inplace(Tensor x, const Tensor& y) override {
    M3_CHECK(x.numel() == y.numel() && x.dtype() == DType::kBF16 && y.dtype() == DType::kBF16,
             "add: {} {} vs {} {}", dtype_name(x.dtype()), x.numel(), dtype_name(y.dtype()), y.numel());
    check_cuda(detail::launch_add(bf16_ptr_mut(x), bf16_ptr(y), x.numel(), stream_), "add");
  }

  void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) override {
    const int64_t rows = x.dim(0), cols = x.dim(1);
    check_act(x, rows, cols, "add_rms_norm residual");
    check_act(y, rows, cols, "add_rms_norm addend");
    check_act(out, rows, cols, "add_rms_norm output");
    check_f32_vector(weight, cols, "rms_norm weight");
    check_cuda(detail::launch_add_rms_norm(bf16_ptr_mut(x), bf16_ptr(y), weight.data_as<const float>(),
                                           static_cast<int>(rows), static_cast<int>(cols), eps, bf16_ptr_mut(out),
                                           stream_),
               "add_rms_norm");
  }

  // ops/sampling.h on the GPU (sampling.cu): the rows, logprob rows and id lists go up in one copy,
  // the ids and logprobs come back in one copy, whose wait is the step's only synchronisation.
  void sample(const Tensor& logits, const SampleBatch& batch, int32_t* ids, RowLogprobs* logprobs) override {
    const int n = static_cast<int>(batch.rows.size());
    const int num_logprobs = static_cast<int>(batch.logprobs.size());
    if (n == 0 && num_logprobs == 0) return;
    batch.wait_masks();  // structured-output masks, computed on the host while the forward ran
    M3_CHECK(logits.defined() && logits.device() == Device::kCuda && logits.dtype() == DType::kBF16 &&
                 logits.ndim() == 2 && logits.dim(1) <= INT32_MAX,
             "cuda backend: sample needs device BF16 [rows, vocab] logits");
    const int64_t vocab = logits.dim(1), list_size = static_cast<int64_t>(batch.ids.size());
    check_logprob_rows(batch, logits.dim(0), static_cast<int32_t>(vocab), logprobs);
    M3_CHECK(batch.counts.size() == batch.ids.size(), "sample: {} ids but {} counts", batch.ids.size(),
             batch.counts.size());
    auto list_ok = [&](int32_t begin, int32_t num) { return begin >= 0 && num >= 0 && int64_t(begin) + num <= list_size; };
    const int64_t mask_rows = batch.allowed_words ? int64_t(batch.allowed.size()) / batch.allowed_words : 0;
    M3_CHECK(batch.allowed.empty() || int64_t(batch.allowed_words) * 32 >= vocab,
             "sample: allowed masks of {} words cannot cover a vocabulary of {}", batch.allowed_words, vocab);
    sample_slots_.assign(n, -1);
    int num_slots = 0;
    bool biased = false;
    for (int i = 0; i < n; ++i) {
      const SampleRow& r = batch.rows[i];
      M3_CHECK(r.logits_row >= 0 && r.logits_row < logits.dim(0), "sample: row {} reads logits row {} of {}", i,
               r.logits_row, logits.dim(0));
      M3_CHECK(list_ok(r.prompt_begin, r.num_prompt) && list_ok(r.output_begin, r.num_output) &&
                   list_ok(r.masked_begin, r.num_masked) && list_ok(r.bias_begin, r.num_bias),
               "sample: row {} has id lists outside the batch's {} ids", i, list_size);
      M3_CHECK(r.num_bias == 0 || batch.biases.size() == batch.ids.size(), "sample: row {} has a logit bias, and the "
               "batch {} biases for {} ids", i, batch.biases.size(), batch.ids.size());
      M3_CHECK(sample_row_greedy(r) || (r.temperature > 0.0f && r.top_p > 0.0f),
               "sample: row {} has temperature {} / top_p {}", i, r.temperature, r.top_p);
      M3_CHECK(r.allowed_row < mask_rows, "sample: row {} reads allowed mask {} of {}", i, r.allowed_row, mask_rows);
      if (r.num_masked > 0 || sample_row_biased(r) || sample_row_penalised(r) || sample_row_constrained(r))
        sample_slots_[i] = num_slots++;
      biased = biased || sample_row_biased(r);
    }
    // One blob: rows | ids | counts | work slots | allowed masks | biases | logprob rows, 256-aligned.
    constexpr int kParts = 7;
    const std::pair<const void*, size_t> parts[kParts] = {
        {batch.rows.data(), n * sizeof(SampleRow)},
        {batch.ids.data(), batch.ids.size() * sizeof(int32_t)},
        {batch.counts.data(), batch.counts.size() * sizeof(int32_t)},
        {sample_slots_.data(), n * sizeof(int32_t)},
        {batch.allowed.data(), batch.allowed.size() * sizeof(uint32_t)},
        {batch.biases.data(), biased ? batch.biases.size() * sizeof(float) : 0},
        {batch.logprobs.data(), num_logprobs * sizeof(LogprobRow)}};
    size_t offsets[kParts], bytes = 0;
    for (int i = 0; i < kParts; ++i) {
      offsets[i] = bytes;
      bytes += (parts[i].second + 255) / 256 * 256;
    }
    sample_pinned_.reserve(bytes, "sampling rows (pinned)");
    sample_meta_.reserve(bytes, "sampling rows");
    // Back: ids | logprobs, one pinned buffer.
    const size_t ids_bytes = (n * sizeof(int32_t) + 255) / 256 * 256, logprob_bytes = num_logprobs * sizeof(RowLogprobs);
    sample_ids_pinned_.reserve(ids_bytes + logprob_bytes, "sampled ids and logprobs (pinned)");
    sample_ids_.reserve(ids_bytes + logprob_bytes, "sampled ids and logprobs");
    if (num_slots > 0) sample_work_.reserve(size_t(num_slots) * vocab * sizeof(float), "sampling rows with penalties");
    for (int i = 0; i < kParts; ++i)
      if (parts[i].second) std::memcpy(sample_pinned_.as<uint8_t>() + offsets[i], parts[i].first, parts[i].second);
    check_cuda(cudaMemcpyAsync(sample_meta_.as(), sample_pinned_.as(), bytes, cudaMemcpyHostToDevice, stream_),
               "sampling rows upload");
    const uint8_t* meta = sample_meta_.as<const uint8_t>();
    detail::SampleArgs a;
    a.logits = bf16_ptr(logits);
    a.vocab = static_cast<int>(vocab);
    a.rows = reinterpret_cast<const SampleRow*>(meta + offsets[0]);
    a.num_rows = n;
    a.ids = reinterpret_cast<const int32_t*>(meta + offsets[1]);
    a.counts = reinterpret_cast<const int32_t*>(meta + offsets[2]);
    a.work_slot = reinterpret_cast<const int32_t*>(meta + offsets[3]);
    a.allowed = reinterpret_cast<const uint32_t*>(meta + offsets[4]);
    a.biases = biased ? reinterpret_cast<const float*>(meta + offsets[5]) : nullptr;
    a.allowed_words = batch.allowed_words;
    a.work = sample_work_.as<float>();
    a.out = sample_ids_.as<int32_t>();
    check_cuda(detail::launch_sample(a, stream_), "sample");
    detail::LogprobArgs l;
    l.logits = a.logits;
    l.vocab = a.vocab;
    l.rows = reinterpret_cast<const LogprobRow*>(meta + offsets[6]);
    l.num_rows = num_logprobs;
    l.drawn = a.out;
    l.out = reinterpret_cast<RowLogprobs*>(sample_ids_.as<uint8_t>() + ids_bytes);
    check_cuda(detail::launch_logprobs(l, stream_), "logprobs");
    check_cuda(cudaMemcpyAsync(sample_ids_pinned_.as(), sample_ids_.as(), ids_bytes + logprob_bytes,
                               cudaMemcpyDeviceToHost, stream_),
               "sampled ids and logprobs");
    check_cuda(cudaStreamSynchronize(stream_), "sample");
    if (n > 0) std::memcpy(ids, sample_ids_pinned_.as(), n * sizeof(int32_t));
    if (num_logprobs > 0) std::memcpy(logprobs, sample_ids_pinned_.as<uint8_t>() + ids_bytes, logprob_bytes);
  }

 private:
  // linear() on a given stream (the MoE shared expert runs on side_stream_).
  void linear_on(const Tensor& x, const LinearWeight& weight, Tensor out, cudaStream_t stream) {
    const int64_t rows = x.dim(0);
    check_act(x, rows, weight.in_features, "input of " + weight.name);
    check_act(out, rows, weight.out_features, "output of " + weight.name);
    const detail::WeightView w = weight_view(weight);
    // cuBLASLt picks its algorithm (tiles, split-K) by M, so a row's sum order would depend on the
    // batch: in batch-invariant mode bf16 weights take the skinny kernel like the quantized ones.
    if (w.kind == detail::WeightKind::kBF16 && !options_.batch_invariant) {
      gemm_->gemm_bf16(bf16_ptr(x), x.dim(1), static_cast<int>(rows), reinterpret_cast<const uint16_t*>(w.data),
                       static_cast<int>(weight.out_features), static_cast<int>(weight.in_features), bf16_ptr_mut(out),
                       out.dim(1), stream);
      return;
    }
    detail::LinearArgs a;
    a.x = bf16_ptr(x);
    a.x_stride = x.dim(1);
    a.rows = static_cast<int>(rows);
    a.n = static_cast<int>(weight.out_features);
    a.k = static_cast<int>(weight.in_features);
    a.w[0] = w;
    a.item_rows = item_rows(w, a.k, a.n, a.rows);
    a.out = bf16_ptr_mut(out);
    a.out_stride = out.dim(1);
    check_cuda(detail::launch_linear(a, stream), weight.name.c_str());
  }
  bool fused_linears(const Tensor& x, std::span<const LinearOutput> outputs) {
    if (outputs.size() < 2 || outputs.size() > size_t(detail::kMaxLinearSegments)) return false;
    const int64_t rows = x.dim(0);
    const LinearWeight& first = *outputs[0].weight;
    const detail::WeightView w0 = weight_view(first);
    const int k = static_cast<int>(first.in_features);
    // bf16: cuBLAS, except in batch-invariant mode, where bf16 takes the skinny kernel as well.
    if ((w0.kind == detail::WeightKind::kBF16 && !options_.batch_invariant) || x.dim(1) % 8 != 0) return false;
    // Up to 32 rows the skinny and streamed kernels walk the segments; at 33-256 rows the wgmma
    // kernel does when the segments together are as wide as a dense layer that takes it
    // (kWgmmaMinDenseWeightRows: M3.1's q, k, v, index q and k are 9,856 rows, 77 tiles), else
    // the streamed kernel; above 256 rows the wgmma kernel always, so that the small projections
    // (k, v: 512 features; index_k: 128, one wave's few CTAs alone) share a launch with q's tiles.
    int weight_rows = 0;
    for (const LinearOutput& o : outputs) weight_rows += static_cast<int>(o.weight->out_features);
    const int item_rows = this->item_rows(w0, k, weight_rows, static_cast<int>(rows));
    detail::LinearArgs a;
    int slices = 0, tiles = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const LinearWeight& weight = *outputs[i].weight;
      check_act(x, rows, weight.in_features, "input of " + weight.name);
      check_act(outputs[i].out, rows, weight.out_features, "output of " + weight.name);
      const detail::WeightView w = weight_view(weight);
      if (w.kind != w0.kind || weight.in_features != first.in_features || !detail::linear_has_mma_path(w, k))
        return false;
      detail::LinearSegment& seg = a.seg[i];
      seg.w = w;
      seg.out = bf16_ptr_mut(outputs[i].out);
      seg.out_stride = outputs[i].out.dim(1);
      seg.n = static_cast<int>(weight.out_features);
      seg.slice_begin = slices;
      slices += (seg.n + 15) / 16;
      seg.tile_begin = tiles;
      tiles += (seg.n + detail::kWgmmaTileFeatures - 1) / detail::kWgmmaTileFeatures;
    }
    a.num_segments = static_cast<int>(outputs.size());
    a.x = bf16_ptr(x);
    a.x_stride = x.dim(1);
    a.rows = static_cast<int>(rows);
    a.n = a.seg[0].n;
    a.k = k;
    a.w[0] = w0;
    a.item_rows = item_rows;
    check_cuda(detail::launch_linear(a, stream_), ("linears from " + first.name).c_str());
    return true;
  }
  // act [rows, inter] = SwiGLU-OAI(x gate^T, x up^T), fused into one GEMM's epilogue.
  void gate_up_swiglu(const uint16_t* x, int64_t x_stride, int rows, const LinearWeight& gate, const LinearWeight& up,
                      float alpha, float limit, uint16_t* act, cudaStream_t stream) {
    detail::LinearArgs a;
    a.x = x;
    a.x_stride = x_stride;
    a.rows = rows;
    a.n = static_cast<int>(gate.out_features);
    a.k = static_cast<int>(gate.in_features);
    a.w[0] = weight_view(gate);
    a.w[1] = weight_view(up);
    a.item_rows = item_rows(a.w[0], a.k, 2 * a.n, rows);
    a.out = act;
    a.out_stride = gate.out_features;
    a.epilogue = detail::Epilogue::kSwiglu;
    a.swiglu_alpha = alpha;
    a.swiglu_limit = limit;
    check_cuda(detail::launch_linear(a, stream), gate.name.c_str());
  }
  // Rows per linear work item: the kernels' choice for the row count, or in batch-invariant mode
  // the one fixed size whose per-row sum order is the same in every batch (backend_kernels.h).
  int item_rows(const detail::WeightView& w, int k, int weight_rows, int rows, bool grouped = false) const {
    return options_.batch_invariant ? detail::kBatchInvariantItemRows
                                    : detail::linear_item_rows(w, k, weight_rows, rows, grouped);
  }
  ExpertTables& expert_tables(const MlpWeights& mlp);
  // Changes whenever scratch a recorded graph may point at moves (cuda_graphs.h).
  int64_t scratch_generation() const { return scratch_moves_ + (msa_ ? msa_->generation() : 0); }

  const CudaBackendOptions options_;
  BackendConfig config_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t upload_done_ = nullptr;
  // moe(): the shared expert's stream, forked from stream_ at fork_ and joined back at join_.
  cudaStream_t side_stream_ = nullptr;
  std::unique_ptr<cuda::KvBlockCopier> kv_copier_;  // made on the first block copy
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::unique_ptr<cuda::CublasLtGemm> gemm_;
  std::unique_ptr<cuda::MsaPlan> msa_;

  // The planned step.
  const StepBatch* batch_ = nullptr;
  StepView step_;
  const int32_t* token_ids_ = nullptr;
  const int32_t* logits_rows_ = nullptr;
  int num_logit_rows_ = 0;
  int graph_pages_ = 0;  // > 0: the step is planned for graph replay with this page-table width
  std::unique_ptr<cuda::GraphCache> graphs_;  // null: --enforce-eager
  // Every device buffer below counts its moves here (scratch_generation()).
  int64_t scratch_moves_ = 0;
  PinnedBuffer meta_pinned_;
  DeviceBuffer meta_{&scratch_moves_};
  int rope_half_ = 1;
  int sm_count_ = 1;
  DeviceBuffer inv_freq_{&scratch_moves_}, rope_cos_{&scratch_moves_}, rope_sin_{&scratch_moves_};

  // Scratch (grow-only).
  DeviceBuffer mlp_act_{&scratch_moves_}, draft_attn_scratch_{&scratch_moves_};
  // The buffers of the ops that wait for the device (copy_to_host_f32, sample, markov_drafts) are
  // never in a recorded graph, so their moves drop none: a verification step's first logits copy
  // or sampling of more rows than any decode must not cost the graphs just recorded.
  DeviceBuffer host_f32_;
  // markov_drafts (grow-only): the argmax keys, the ids and confidences, and their host copy.
  DeviceBuffer markov_keys_, markov_out_;
  PinnedBuffer markov_out_pinned_;
  // Sampling (grow-only).
  PinnedBuffer sample_pinned_, sample_ids_pinned_;
  DeviceBuffer sample_meta_, sample_ids_, sample_work_;
  std::vector<int32_t> sample_slots_;
  DeviceBuffer moe_logits_{&scratch_moves_}, moe_choice_expert_{&scratch_moves_},
      moe_choice_weight_{&scratch_moves_}, moe_choice_row_{&scratch_moves_}, moe_row_token_{&scratch_moves_},
      moe_counts_{&scratch_moves_}, moe_items_{&scratch_moves_}, moe_num_items_{&scratch_moves_},
      moe_act_{&scratch_moves_}, moe_y_{&scratch_moves_}, moe_shared_act_{&scratch_moves_},
      moe_shared_{&scratch_moves_};
  // The fused decode routing's arrival counter (detail::MoeRouteArgs::done): zero at allocation,
  // set back to zero by the launch that counts to the end, never moved.
  Tensor moe_route_done_ = cuda::device_tensor({1}, DType::kI32, "MoE routing counter");
  std::unordered_map<const void*, std::unique_ptr<ExpertTables>> expert_tables_;
  std::vector<detail::WeightView> expert_views_;  // expert_tables' scratch
};

// A uniform decode step of a shape graphs are kept for: q tokens per sequence (1, or up to
// kMaxGraphQueryTokens: a speculative verification step) and a logits row for each.
bool graph_shape(const StepBatch& b) {
  const int s_count = b.num_seqs();
  if (s_count < 1 || s_count > cuda::kMaxGraphSeqs || b.query_start.size() != size_t(s_count) + 1) return false;
  const int q = b.query_start[1] - b.query_start[0];
  if (q < 1 || q > cuda::kMaxGraphQueryTokens || b.num_tokens() != s_count * q ||
      b.logits_rows.size() != size_t(b.num_tokens()))
    return false;
  for (int s = 0; s < s_count; ++s)
    if (b.query_start[s + 1] - b.query_start[s] != q) return false;
  return true;
}

// cudaMemcpyAsync between two fresh buffers on the backend's stream, after every op queued before
// (the step's ops do not overlap it), timed with events. The buffers take at most a quarter of the
// free memory each (a model and its KV pool may leave little), and at least 64 MiB: still beyond
// the 50 MB L2 of an H100 / H200, so the copy runs at the memory's speed.
double CudaBackend::measure_copy_rate(int64_t bytes, int repeats) {
  M3_CHECK(bytes >= (int64_t{1} << 20) && repeats >= 1, "cuda copy rate: a buffer of {} bytes, {} repeats", bytes,
           repeats);
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "copy rate: free memory");
  constexpr int64_t kLeast = int64_t{64} << 20;
  bytes = std::min<int64_t>(bytes, int64_t(free_bytes / 4) / 256 * 256);
  M3_CHECK(bytes >= kLeast, "cuda copy rate: {:.0f} MiB free, too little for two buffers of 64 MiB",
           free_bytes / 1048576.0);
  const Tensor from = cuda::device_tensor({bytes}, DType::kU8, "the copy rate's source");
  const Tensor to = cuda::device_tensor({bytes}, DType::kU8, "the copy rate's destination");
  const auto event = [] {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "copy rate event");
    return std::unique_ptr<CUevent_st, decltype(&cudaEventDestroy)>(e, &cudaEventDestroy);
  };
  const auto start = event(), stop = event();
  const auto copy = [&] {
    check_cuda(cudaMemcpyAsync(to.data(), from.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_),
               "copy rate copy");
  };
  copy();
  float best_ms = 0;
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventRecord(start.get(), stream_), "copy rate event");
    copy();
    check_cuda(cudaEventRecord(stop.get(), stream_), "copy rate event");
    check_cuda(cudaEventSynchronize(stop.get()), "copy rate copy");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start.get(), stop.get()), "copy rate event");
    if (i == 0 || ms < best_ms) best_ms = ms;
  }
  M3_CHECK(best_ms > 0, "cuda copy rate: a copy of {} bytes timed at {} ms", bytes, best_ms);
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
}

void CudaBackend::plan(const StepBatch& b) {
  batch_ = &b;
  const int t_count = b.num_tokens(), s_count = b.num_seqs();
  const int r_count = static_cast<int>(b.logits_rows.size());
  M3_CHECK(b.positions.size() == size_t(t_count) && b.token_seq.size() == size_t(t_count) &&
               b.slot_mapping.size() == size_t(t_count) &&
               b.page_table.size() >= size_t(s_count) * b.pages_per_seq,
           "cuda backend: step arrays disagree ({} tokens)", t_count);
  const int bs = config_.block_size;
  int max_blocks = 1;
  for (int32_t len : b.seq_lens) max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
  // Graph mode: the page table is re-laid at the bucket's width, so that every by-value argument
  // (widths, offsets in the metadata blob, bounds) is a function of the step's shape alone.
  graph_pages_ = graphs_ && graph_shape(b) ? cuda::graph_pages_bucket(max_blocks) : 0;
  const int table_width = graph_pages_ > 0 ? graph_pages_ : b.pages_per_seq;
  const size_t page_entries = size_t(s_count) * table_width;
  // One blob: ids | positions | token_seq | slots | seq_lens | page_table | logits_rows, 256-aligned.
  const std::vector<std::pair<const int32_t*, size_t>> parts = {
      {b.token_ids.data(), size_t(t_count)},  {b.positions.data(), size_t(t_count)},
      {b.token_seq.data(), size_t(t_count)},  {b.slot_mapping.data(), size_t(t_count)},
      {b.seq_lens.data(), size_t(s_count)},   {nullptr, page_entries},
      {b.logits_rows.data(), size_t(r_count)}};
  std::vector<size_t> offsets;
  size_t bytes = 0;
  for (const auto& [ptr, n] : parts) {
    offsets.push_back(bytes);
    bytes += (n * sizeof(int32_t) + 255) / 256 * 256;
  }
  bytes = std::max<size_t>(bytes, 256);
  check_cuda(cudaEventSynchronize(upload_done_), "previous metadata upload");
  meta_pinned_.reserve(bytes, "step metadata (pinned)");
  meta_.reserve(bytes, "step metadata");
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i].first && parts[i].second)
      std::memcpy(meta_pinned_.as<uint8_t>() + offsets[i], parts[i].first, parts[i].second * 4);
  int32_t* table = reinterpret_cast<int32_t*>(meta_pinned_.as<uint8_t>() + offsets[5]);
  const int copy_width = std::min(table_width, b.pages_per_seq);  // pages past max_blocks are never read
  for (int s = 0; s < s_count; ++s) {
    std::memcpy(table + size_t(s) * table_width, b.page_table.data() + size_t(s) * b.pages_per_seq, copy_width * 4);
    std::fill(table + size_t(s) * table_width + copy_width, table + size_t(s + 1) * table_width, 0);
  }
  check_cuda(cudaMemcpyAsync(meta_.as(), meta_pinned_.as(), bytes, cudaMemcpyHostToDevice, stream_), "metadata upload");
  check_cuda(cudaEventRecord(upload_done_, stream_), "metadata upload event");
  auto at = [&](int i) { return reinterpret_cast<const int32_t*>(meta_.as<uint8_t>() + offsets[i]); };
  token_ids_ = at(0);
  logits_rows_ = at(6);
  num_logit_rows_ = r_count;
  step_.num_tokens = t_count;
  step_.num_seqs = s_count;
  step_.positions = at(1);
  step_.token_seq = at(2);
  step_.slot_mapping = at(3);
  step_.seq_lens = at(4);
  step_.page_table = at(5);
  step_.pages_per_seq = table_width;
  step_.max_blocks = graph_pages_ > 0 ? graph_pages_ : max_blocks;

  rope_cos_.reserve(sizeof(float) * std::max(1, t_count) * rope_half_, "rope cos");
  rope_sin_.reserve(sizeof(float) * std::max(1, t_count) * rope_half_, "rope sin");
  check_cuda(detail::launch_rope_tables(step_.positions, t_count, inv_freq_.as<const float>(), rope_half_,
                                        config_.rope_attention_factor, rope_cos_.as<float>(),
                                        rope_sin_.as<float>(), stream_),
             "rope tables");
  if (msa_) msa_->plan(b, step_, stream_, graph_pages_);
}

ExpertTables& CudaBackend::expert_tables(const MlpWeights& mlp) {
  const void* key = mlp.experts.front().gate.weight.data();
  const size_t e_count = mlp.experts.size();
  std::vector<detail::WeightView>& views = expert_views_;  // reused: no allocation in steady state
  views.resize(3 * e_count);
  for (size_t e = 0; e < e_count; ++e) {
    const ExpertWeights& ew = mlp.experts[e];
    views[e] = weight_view(ew.gate);
    views[e_count + e] = weight_view(ew.up);
    views[2 * e_count + e] = weight_view(ew.down);
    for (int j = 0; j < 3; ++j) {
      const detail::WeightView& v = views[j * e_count + e];
      const detail::WeightView& v0 = views[j * e_count];
      M3_CHECK(v.kind == v0.kind, "MoE {}: experts mix weight formats", ew.gate.name);
    }
  }
  auto it = expert_tables_.find(key);
  if (it != expert_tables_.end()) {
    const std::vector<detail::WeightView>& held = it->second->host_views;
    bool same = held.size() == views.size();
    for (size_t i = 0; same && i < views.size(); ++i) same = same_view(held[i], views[i]);
    if (same) return *it->second;
    expert_tables_.erase(it);  // the weights it described were freed; these reuse the address
  }
  auto t = std::make_unique<ExpertTables>();
  t->host_views = views;
  for (int j = 0; j < 3; ++j) t->first[j] = views[j * e_count];
  for (const detail::WeightView& v : views) t->streamed_ok = t->streamed_ok && detail::streamed_weight_ok(v);
  t->views.reserve(views.size() * sizeof(detail::WeightView), "expert weight table");
  check_cuda(cudaMemcpy(t->views.as(), views.data(), views.size() * sizeof(detail::WeightView), cudaMemcpyHostToDevice),
             "expert weight table");
  return *expert_tables_.emplace(key, std::move(t)).first->second;
}

// The MoE block: shared expert (fused gate/up + SwiGLU, down), router and permutation on the
// device, grouped gate/up + SwiGLU over the routed rows, grouped down, weighted combine.
// The shared expert does not depend on the routing and each of its GEMMs alone under-fills the
// GPU at decode sizes, so above kMoeInterleaveSharedMaxTokens tokens it runs on side_stream_
// beside the routed experts: fork_ (recorded on stream_) starts it, join_ ends it before the
// combine. Decode-sized steps (the small router, up to kMoeSmallRouterMaxTokens tokens) fork
// after the routing launch: forked before it, the shared expert's persistent CTAs held the SMs
// and the router's CTAs waited for them, so the routing that the routed experts wait on took 37
// us of a batch-1 step instead of a few (bench latency --kernel-timeline,
// docs/gpu-backend-notes.md "Session 38"). Prefill steps fork first, so the shared expert runs
// under their longer routing. Under stream capture the side stream joins the capture through the
// wait on fork_. Its buffers (moe_shared_act_, moe_shared_) are its own, and the next MoE op's
// fork comes after this op's combine in stream_ order, so results are those of the serial order
// bit for bit.
// Expert parallel (a subset of the experts): the routing still ranks all experts; the grouped GEMMs
// see only the rows of the held experts and the combine skips the others' choices. Routed only
// (!add_shared): no side stream, and the combine adds no shared expert.
void CudaBackend::moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) {
  const int64_t rows = x.dim(0), hidden = x.dim(1);
  const int e_count = params.num_experts, k = params.experts_per_token;
  check_act(x, rows, hidden, "MoE input");
  check_act(out, rows, hidden, "MoE output");
  const int first = params.first_expert, held = static_cast<int>(mlp.experts.size());
  M3_CHECK(e_count > 0 && first >= 0 && held >= 1 && first + held <= e_count,
           "cuda backend: MoE layer holds experts [{}, {}) of the config's {}", first, first + held, e_count);
  M3_CHECK(k >= 1 && k <= 16 && k <= e_count && e_count <= 512, "MoE: top-{} of {} experts is not supported", k,
           e_count);
  M3_CHECK(mlp.router.dtype() == DType::kF32 && mlp.router.device() == Device::kCuda &&
               mlp.router.numel() == int64_t(e_count) * hidden,
           "router weight must be a device F32 [{}, {}]", e_count, hidden);
  if (rows == 0) return;
  const int64_t inter = mlp.experts.front().gate.out_features;
  const bool add_shared = params.add_shared;
  const int64_t shared_inter = add_shared ? mlp.gate.out_features : 0;
  // Checked here, not inside the side stream's calls: a throw between fork and join would leave a
  // capture unjoined.
  M3_CHECK(!add_shared || (mlp.gate.in_features == hidden && mlp.up.in_features == hidden &&
                           mlp.up.out_features == shared_inter && mlp.down.in_features == shared_inter &&
                           mlp.down.out_features == hidden),
           "MoE {}: shared expert shapes disagree (gate {}x{}, up {}x{}, down {}x{}, hidden {})", mlp.gate.name,
           mlp.gate.out_features, mlp.gate.in_features, mlp.up.out_features, mlp.up.in_features,
           mlp.down.out_features, mlp.down.in_features, hidden);
  const int64_t pairs = rows * k;
  // The permuted rows: a token's k choices are distinct experts, at most `held` of them here.
  const int64_t held_pairs = rows * std::min(k, held);
  ExpertTables& tables = expert_tables(mlp);
  // Rows per expert as the routing spreads them over all experts (the held ones get their share).
  const int per_expert = static_cast<int>((pairs + e_count - 1) / e_count);
  const int item_rows = this->item_rows(tables.first[0], static_cast<int>(hidden), /*weight_rows=*/0, per_expert,
                                       /*grouped=*/true);
  const int max_items =
      static_cast<int>((held_pairs + item_rows - 1) / item_rows + std::min<int64_t>(held, held_pairs));

  // Every buffer is sized before the fork: a grown buffer is freed and reallocated, which must not
  // happen while the side stream runs.
  if (add_shared) {
    moe_shared_act_.reserve(size_t(rows) * std::max<int64_t>(shared_inter, 1) * 2, "shared expert activation");
    moe_shared_.reserve(size_t(rows) * hidden * 2, "shared expert output");
  }
  moe_logits_.reserve(sizeof(float) * rows * e_count, "router logits");
  moe_choice_expert_.reserve(sizeof(int32_t) * pairs, "MoE choices");
  moe_choice_weight_.reserve(sizeof(float) * pairs, "MoE choices");
  moe_choice_row_.reserve(sizeof(int32_t) * pairs, "MoE choices");
  moe_row_token_.reserve(sizeof(int32_t) * held_pairs, "MoE permutation");
  moe_counts_.reserve(sizeof(int32_t) * (2 * e_count + 2), "MoE counts");
  moe_items_.reserve(sizeof(detail::LinearItem) * max_items, "MoE work items");
  moe_num_items_.reserve(sizeof(int32_t), "MoE work items");
  moe_act_.reserve(size_t(held_pairs) * inter * 2, "routed expert activation");
  moe_y_.reserve(size_t(held_pairs) * hidden * 2, "routed expert output");

  // The shared expert's two launches.
  auto shared_gate_up = [&](cudaStream_t stream) {
    gate_up_swiglu(bf16_ptr(x), hidden, static_cast<int>(rows), mlp.gate, mlp.up, params.swiglu_alpha,
                   params.swiglu_limit, moe_shared_act_.as<uint16_t>(), stream);
  };
  auto shared_down = [&](cudaStream_t stream) {
    Tensor shared_act = Tensor::wrap(moe_shared_act_.as(), {rows, shared_inter}, DType::kBF16, Device::kCuda);
    Tensor shared = Tensor::wrap(moe_shared_.as(), {rows, hidden}, DType::kBF16, Device::kCuda);
    linear_on(shared_act, mlp.down, shared, stream);
  };
  // Steps of up to kMoeInterleaveSharedMaxTokens (one) token run the shared expert in the main
  // stream between the routed launches (routing, shared gate/up, routed gate/up, shared down,
  // routed down), so that each streamed launch has every SM and fills its weight ring during the
  // launch before it (launch.cuh; the routed gate/up may, its items written two launches
  // earlier). On the side stream the two branches' persistent CTAs took the SMs from each other:
  // at batch 1 the shared down waited ~27 us for slots. With more tokens the routed experts read
  // more weights and the branches overlap better: on an H100 the interleaved order made batch 1's
  // step 1.6-1.9% faster, batches 2 and 4 no faster, and 8-128 0.3-2.6% slower
  // (docs/gpu-backend-notes.md, "Session 42").
  const bool route_first = rows <= detail::kMoeSmallRouterMaxTokens;
  const bool interleave_shared = add_shared && rows <= kMoeInterleaveSharedMaxTokens;
  const bool shared_on_side = add_shared && !interleave_shared;
  auto fork_shared_expert = [&] {
    check_cuda(cudaEventRecord(fork_, stream_), "MoE fork");
    check_cuda(cudaStreamWaitEvent(side_stream_, fork_, 0), "MoE fork");
    shared_gate_up(side_stream_);
    shared_down(side_stream_);
    check_cuda(cudaEventRecord(join_, side_stream_), "MoE join");
  };
  if (shared_on_side && !route_first) fork_shared_expert();

  // Routing and permutation.
  detail::MoeRouteArgs r;
  r.x = bf16_ptr(x);
  r.num_tokens = static_cast<int>(rows);
  r.hidden = static_cast<int>(hidden);
  r.router = mlp.router.data_as<const float>();
  r.bias = mlp.router_bias.defined() ? mlp.router_bias.data_as<const float>() : nullptr;
  r.num_experts = e_count;
  r.top_k = k;
  r.first_expert = first;
  r.held_experts = held;
  r.logits = moe_logits_.as<float>();
  r.choice_expert = moe_choice_expert_.as<int32_t>();
  r.choice_weight = moe_choice_weight_.as<float>();
  r.choice_row = moe_choice_row_.as<int32_t>();
  r.row_token = moe_row_token_.as<int32_t>();
  r.expert_count = moe_counts_.as<int32_t>();
  r.items = moe_items_.as<detail::LinearItem>();
  r.num_items = moe_num_items_.as<int32_t>();
  r.item_rows = item_rows;
  r.max_items = max_items;
  r.batch_invariant = options_.batch_invariant;
  r.done = moe_route_done_.data_as<int32_t>();
  check_cuda(detail::launch_moe_route(r, stream_), "MoE routing");
  if (shared_on_side && route_first) fork_shared_expert();
  if (interleave_shared) shared_gate_up(stream_);

  // Routed experts over the permuted rows.
  const detail::WeightView* table = tables.views.as<const detail::WeightView>();
  detail::LinearArgs a;
  a.x = bf16_ptr(x);
  a.x_stride = hidden;
  a.x_rows = r.row_token;
  a.rows = static_cast<int>(held_pairs);
  a.n = static_cast<int>(inter);
  a.k = static_cast<int>(hidden);
  a.w[0] = tables.first[0];
  a.w[1] = tables.first[1];
  a.table[0] = table;
  a.table[1] = table + held;
  a.items = r.items;
  a.num_items = r.num_items;
  a.max_items = max_items;
  a.item_rows = item_rows;
  a.table_streamed_ok = tables.streamed_ok;
  a.out = moe_act_.as<uint16_t>();
  a.out_stride = inter;
  a.epilogue = detail::Epilogue::kSwiglu;
  a.swiglu_alpha = params.swiglu_alpha;
  a.swiglu_limit = params.swiglu_limit;
  a.schedule_ready = interleave_shared;  // the shared gate/up between it and the routing
  // The gathered rows go where the down projection writes later (moe_y_: as many rows, hidden wide).
  check_cuda(detail::launch_moe_gate_up(a, r, moe_y_.as<uint16_t>(), stream_), "routed experts gate/up");

  detail::LinearArgs d = a;
  d.x = moe_act_.as<const uint16_t>();
  d.x_stride = inter;
  d.x_rows = nullptr;
  d.n = static_cast<int>(hidden);
  d.k = static_cast<int>(inter);
  d.w[0] = tables.first[2];
  d.w[1] = detail::WeightView();
  d.table[0] = table + 2 * held;
  d.table[1] = nullptr;
  d.out = moe_y_.as<uint16_t>();
  d.out_stride = hidden;
  d.epilogue = detail::Epilogue::kStore;
  d.schedule_ready = true;  // the routing's items, a launch or more before gate/up
  if (interleave_shared) shared_down(stream_);
  check_cuda(detail::launch_linear(d, stream_), "routed experts down");

  if (shared_on_side) check_cuda(cudaStreamWaitEvent(stream_, join_, 0), "MoE join");

  check_cuda(detail::launch_moe_combine(moe_y_.as<const uint16_t>(), r.choice_row, r.choice_weight,
                                        static_cast<int>(rows), k, static_cast<int>(hidden),
                                        params.routed_scaling_factor,
                                        add_shared ? moe_shared_.as<const uint16_t>() : nullptr,
                                        bf16_ptr_mut(out), stream_),
             "MoE combine");
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void use_cuda_device(int device) { check_cuda(cudaSetDevice(device), "cudaSetDevice"); }

CudaDeviceInfo cuda_device_info() {
  CudaDeviceInfo info;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return info;
  }
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return info;
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return info;
  info.available = true;
  info.name = prop.name;
  info.total_bytes = static_cast<int64_t>(total);
  info.free_bytes = static_cast<int64_t>(free_bytes);
  info.sm_count = prop.multiProcessorCount;
  info.compute_capability = prop.major * 10 + prop.minor;
  return info;
}

void* cuda_backend_stream(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend ? static_cast<void*>(cuda_backend->stream()) : nullptr;
}

CudaGraphStats cuda_graph_stats(const Backend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  return cuda_backend ? cuda_backend->graph_stats() : CudaGraphStats{};
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  const CudaDeviceInfo info = cuda_device_info();
  M3_CHECK(info.available, "--device cuda: no usable CUDA device (no GPU, or no driver)");
  M3_CHECK(info.compute_capability == 90,
           "--device cuda: {} has compute capability {}.{}; the CUDA backend is built for Hopper (sm_90a)", info.name,
           info.compute_capability / 10, info.compute_capability % 10);
  return std::make_unique<CudaBackend>(options);
}

}  // namespace m3
