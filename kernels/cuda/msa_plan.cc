// MsaPlan: per-step schedules for the MSA kernels and the per-layer launches.
//
// plan() takes the step's work lists from build_msa_schedule (msa_schedule.cc), sizes the
// workspaces, and uploads everything in one async copy from pinned memory.
#include "kernels/cuda/msa.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/msa_kernels.h"
#include "kernels/cuda/msa_schedule.h"

namespace m3::cuda {
namespace {

using detail::CombineWork;
using detail::DenseWork;
using detail::IndexerWork;
using detail::SparseWork;

void check_cuda(cudaError_t e, const char* what) {
  M3_CHECK(e == cudaSuccess, "CUDA error in {}: {} ({})", what, cudaGetErrorString(e), int(e));
}

// Grow-only device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  // True when the buffer moved.
  bool reserve(size_t bytes, const char* what) {
    if (bytes <= size_) return false;
    if (ptr_) check_cuda(cudaFree(ptr_), what);
    ptr_ = nullptr;
    size_ = 0;
    check_cuda(cudaMalloc(&ptr_, bytes), what);
    size_ = bytes;
    return true;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  void reserve(size_t bytes) {
    if (bytes <= size_) return;
    if (ptr_) check_cuda(cudaFreeHost(ptr_), "pinned metadata");
    ptr_ = nullptr;
    size_ = 0;
    check_cuda(cudaMallocHost(&ptr_, bytes), "pinned metadata");
    size_ = bytes;
  }
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Appends typed arrays to one byte blob at 256-byte aligned offsets; an array takes at least
// `capacity` elements (zero padded) so that later offsets do not depend on its length.
class Blob {
 public:
  template <class T>
  size_t add(const std::vector<T>& v, size_t capacity = 0) {
    const size_t offset = (bytes_.size() + 255) / 256 * 256;
    bytes_.resize(offset + std::max(v.size(), capacity) * sizeof(T));
    if (!v.empty()) std::memcpy(bytes_.data() + offset, v.data(), v.size() * sizeof(T));
    return offset;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

struct MsaPlan::Impl {
  MsaConfig config;
  int num_sms = 0;
  // CTAs that run at once (SMs x CTAs per SM) of the indexer and of sparse attention, with the
  // NVFP4 caches the work lists are tuned for (other dtypes fit as many or fewer).
  // On NVFP4 caches rows alone run sparse_rows.cu's kernel, groups sparse_groups.cu's.
  int indexer_slots = 0, sparse_rows_slots = 0, sparse_group_slots = 0;
  int64_t generation = 0;
  cudaEvent_t upload_done = nullptr;
  DeviceBuffer table, meta, scores, partial_o, partial_ml;
  // One arrival counter per sparse combine item (AttentionArgs::combine_done): zeroed when
  // allocated, set back to zero by the CTA that merges.
  DeviceBuffer combine_done;
  PinnedBuffer pinned;

  // The current step.
  TimingProbe probe;
  StepView step;
  int num_tokens = 0;
  int max_candidates = 0;
  bool graph = false;  // graph mode: launches read the real counts at off_counts
  size_t off_counts = 0, off_score_offset = 0, off_indexer = 0, off_sparse = 0, off_sparse_rows = 0, off_sparse_combine = 0,
         off_dense = 0, off_dense_combine = 0;
  Stats stats;

  template <class T>
  const T* meta_at(size_t offset) const {
    return reinterpret_cast<const T*>(static_cast<const uint8_t*>(meta.get()) + offset);
  }
  const uint2* e4m3_table() const { return static_cast<const uint2*>(table.get()); }
};

MsaPlan::MsaPlan(const MsaConfig& config) : impl_(std::make_unique<Impl>()) {
  const IndexerParams& ip = config.indexer;
  M3_CHECK(config.num_kv_heads > 0 && config.num_q_heads % config.num_kv_heads == 0,
           "MSA CUDA: {} query heads do not split into {} KV heads", config.num_q_heads,
           config.num_kv_heads);
  M3_CHECK(config.num_q_heads / config.num_kv_heads <= detail::kMaxGroup,
           "MSA CUDA: {} query heads per KV head (at most {} supported)",
           config.num_q_heads / config.num_kv_heads, detail::kMaxGroup);
  M3_CHECK(config.head_dim == detail::kDim, "MSA CUDA: head_dim {} (kernels are built for {})",
           config.head_dim, detail::kDim);
  M3_CHECK(config.index_dim == 0 || config.index_dim == detail::kDim,
           "MSA CUDA: index_head_dim {} (kernels are built for {})", config.index_dim, detail::kDim);
  M3_CHECK(config.block_size % detail::kTileTokens == 0 &&
               config.block_size <= detail::kTileTokens * detail::kMaxTilesPerBlock,
           "MSA CUDA: block_size {} must be a multiple of {} up to {}", config.block_size,
           detail::kTileTokens, detail::kTileTokens * detail::kMaxTilesPerBlock);
  if (config.index_dim > 0) {
    M3_CHECK(ip.index_heads > 0 && ip.index_heads <= detail::kIndexerRows,
             "MSA CUDA: {} index heads", ip.index_heads);
    M3_CHECK(ip.topk_blocks > 0 && ip.topk_blocks <= 128, "MSA CUDA: topk_blocks {} (1..128)",
             ip.topk_blocks);
    M3_CHECK(ip.local_blocks >= 0 && ip.init_blocks >= 0, "MSA CUDA: negative forced blocks");
  }
  impl_->config = config;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&impl_->num_sms, cudaDevAttrMultiProcessorCount, device),
             "multiprocessor count");
  check_cuda(detail::init_indexer_kernels(), "indexer kernel attributes");
  check_cuda(detail::init_topk_kernels(), "top-k kernel attributes");
  check_cuda(detail::init_attention_kernels(), "attention kernel attributes");
  check_cuda(detail::init_sparse_rows_kernel(), "sparse rows kernel attributes");
  check_cuda(detail::init_sparse_groups_kernel(), "sparse groups kernel attributes");
  impl_->indexer_slots = impl_->num_sms * detail::indexer_ctas_per_sm(KvDType::kNVFP4);
  impl_->sparse_rows_slots = impl_->num_sms * detail::sparse_rows_ctas_per_sm();
  impl_->sparse_group_slots = impl_->num_sms * detail::sparse_groups_ctas_per_sm();
  check_cuda(cudaEventCreateWithFlags(&impl_->upload_done, cudaEventDisableTiming), "event");
  impl_->table.reserve(256 * sizeof(uint2), "e4m3 table");
  check_cuda(detail::build_e4m3_table(static_cast<uint2*>(impl_->table.get()), nullptr), "e4m3 table");
  check_cuda(cudaDeviceSynchronize(), "e4m3 table");
}

MsaPlan::~MsaPlan() {
  if (impl_ && impl_->upload_done) cudaEventDestroy(impl_->upload_done);
}

int64_t MsaPlan::generation() const { return impl_->generation; }
void MsaPlan::set_timing_probe(const TimingProbe& probe) { impl_->probe = probe; }
MsaPlan::Stats MsaPlan::stats() const { return impl_->stats; }

void MsaPlan::plan(const StepBatch& host, const StepView& device, cudaStream_t stream,
                   int graph_pages_per_seq) {
  Impl& im = *impl_;
  const MsaConfig& cfg = im.config;
  const IndexerParams& ip = cfg.indexer;
  const int T = host.num_tokens(), S = host.num_seqs();
  M3_CHECK(device.num_tokens == T && device.num_seqs == S, "MSA plan: device view has {} tokens / {} seqs, host {} / {}",
           device.num_tokens, device.num_seqs, T, S);
  MsaSlots slots;
  slots.sms = im.num_sms;
  slots.indexer = im.indexer_slots;
  slots.sparse_rows = im.sparse_rows_slots;
  slots.sparse_groups = im.sparse_group_slots;
  const MsaSchedule sc = build_msa_schedule(cfg, host, slots, graph_pages_per_seq);
  const bool graph = graph_pages_per_seq > 0;
  if (cfg.index_dim > 0) {
    if (im.scores.reserve(size_t(sc.score_capacity) * ip.index_heads * 4, "indexer scores")) ++im.generation;
  }
  const int64_t partials = std::max(sc.sparse_partials, sc.dense_partials);
  if (im.partial_o.reserve(size_t(partials) * detail::kMaxGroup * detail::kDim * 4, "attention partials")) ++im.generation;
  if (im.partial_ml.reserve(size_t(partials) * detail::kMaxGroup * 2 * 4, "attention partials")) ++im.generation;
  im.stats.sparse_splits = sc.sparse_splits;
  im.stats.sparse_parts = sc.sparse_parts;
  const size_t combine_items = size_t(std::max<int64_t>(int64_t(sc.sparse_combine.size()), sc.sparse_combine_cap));
  if (im.combine_done.reserve(std::max<size_t>(combine_items, 1) * sizeof(int32_t), "sparse combine counters")) {
    check_cuda(cudaMemsetAsync(im.combine_done.get(), 0, im.combine_done.bytes(), stream), "sparse combine counters");
    ++im.generation;
  }

  Blob blob;
  // Item counts for graph mode's launches (which launch the bounds): indexer, dense, dense
  // combine, sparse groups, sparse combine, sparse rows, sparse combine of the groups alone.
  const std::vector<int32_t> counts = {static_cast<int32_t>(sc.indexer.size()), static_cast<int32_t>(sc.dense.size()),
                                       static_cast<int32_t>(sc.dense_combine.size()),
                                       static_cast<int32_t>(sc.sparse_groups.size()),
                                       static_cast<int32_t>(sc.sparse_combine.size()),
                                       static_cast<int32_t>(sc.sparse_rows.size()),
                                       static_cast<int32_t>(sc.sparse_group_combines)};
  im.off_counts = blob.add(counts);
  im.off_score_offset = blob.add(sc.score_offset);
  im.off_indexer = blob.add(sc.indexer, sc.indexer_cap);
  im.off_sparse = blob.add(sc.sparse_groups, sc.sparse_groups_cap);
  im.off_sparse_rows = blob.add(sc.sparse_rows, sc.sparse_rows_cap);
  im.off_sparse_combine = blob.add(sc.sparse_combine, sc.sparse_combine_cap);
  im.off_dense = blob.add(sc.dense, sc.dense_cap);
  im.off_dense_combine = blob.add(sc.dense_combine, sc.dense_combine_cap);
  const std::vector<uint8_t>& bytes = blob.bytes();
  // The previous step's upload must be done before its pinned bytes are overwritten.
  check_cuda(cudaEventSynchronize(im.upload_done), "previous metadata upload");
  im.pinned.reserve(bytes.size());
  if (im.meta.reserve(bytes.size(), "step metadata")) ++im.generation;
  if (!bytes.empty()) {
    std::memcpy(im.pinned.get(), bytes.data(), bytes.size());
    check_cuda(cudaMemcpyAsync(im.meta.get(), im.pinned.get(), bytes.size(), cudaMemcpyHostToDevice, stream),
               "metadata upload");
  }
  check_cuda(cudaEventRecord(im.upload_done, stream), "metadata upload event");

  im.step = device;
  im.num_tokens = T;
  im.graph = graph;
  im.max_candidates = graph ? graph_pages_per_seq : sc.max_candidates;
  im.stats.indexer_items = static_cast<int>(sc.indexer.size());
  im.stats.sparse_items = static_cast<int>(sc.sparse_groups.size() + sc.sparse_rows.size());
  im.stats.sparse_group_items = static_cast<int>(sc.sparse_groups.size());
  im.stats.sparse_row_items = static_cast<int>(sc.sparse_rows.size());
  im.stats.dense_items = static_cast<int>(sc.dense.size());
  im.stats.combine_sparse = static_cast<int>(sc.sparse_combine.size());
  im.stats.combine_dense = static_cast<int>(sc.dense_combine.size());
  im.stats.indexer_launch = graph ? sc.indexer_cap : im.stats.indexer_items;
  im.stats.sparse_group_launch = graph ? sc.sparse_groups_cap : im.stats.sparse_group_items;
  im.stats.sparse_row_launch = graph ? sc.sparse_rows_cap : im.stats.sparse_row_items;
  im.stats.combine_sparse_launch = graph ? sc.sparse_combine_cap : im.stats.combine_sparse;
  im.stats.combine_sparse_group_launch = graph ? sc.sparse_group_combine_cap : sc.sparse_group_combines;
  im.stats.dense_launch = graph ? sc.dense_cap : im.stats.dense_items;
  im.stats.combine_dense_launch = graph ? sc.dense_combine_cap : im.stats.combine_dense;
  im.stats.score_entries = sc.score_entries * std::max(0, ip.index_heads);
}

void MsaPlan::kv_insert(const KvLayerView& cache, const uint16_t* k, const uint16_t* v,
                        const uint16_t* index_k, cudaStream_t stream) const {
  const Impl& im = *impl_;
  detail::KvInsertArgs a;
  a.cache = cache;
  a.step = im.step;
  a.num_tokens = im.num_tokens;
  a.k = k;
  a.v = v;
  a.index_k = index_k;
  check_cuda(detail::launch_kv_insert(a, stream), "kv_insert launch");
}

void MsaPlan::indexer_scores(const KvLayerView& cache, const void* index_q, ActDType q_dtype,
                             cudaStream_t stream) const {
  const Impl& im = *impl_;
  M3_CHECK(cache.index_dim == detail::kDim, "indexer: layer has no {}-dim index cache (index_dim {})",
           detail::kDim, cache.index_dim);
  M3_CHECK(cache.index_dtype != KvDType::kF32, "indexer: float32 index cache is CPU-only");
  detail::IndexerArgs a;
  a.cache = cache;
  a.step = im.step;
  a.index_q = index_q;
  a.q_kind = q_dtype == ActDType::kBF16 ? detail::ActKind::kBF16 : detail::ActKind::kE4M3;
  a.index_heads = im.config.indexer.index_heads;
  a.local_blocks = im.config.indexer.local_blocks;
  a.work = im.meta_at<IndexerWork>(im.off_indexer);
  a.num_work = im.stats.indexer_launch;
  a.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) : nullptr;
  a.score_offset = im.meta_at<int32_t>(im.off_score_offset);
  a.scores = static_cast<float*>(im.scores.get());
  a.e4m3_table = im.e4m3_table();
  a.probe_skip_decode = im.probe.skip_index_decode;
  check_cuda(detail::launch_indexer_scores(a, stream), "indexer launch");
}

void MsaPlan::topk(int32_t* selection, cudaStream_t stream) const {
  const Impl& im = *impl_;
  const IndexerParams& ip = im.config.indexer;
  detail::TopkArgs a;
  a.step = im.step;
  a.num_tokens = im.num_tokens;
  a.index_heads = ip.index_heads;
  a.block_size = im.config.block_size;
  a.topk = ip.topk_blocks;
  a.local_blocks = ip.local_blocks;
  a.init_blocks = ip.init_blocks;
  a.score_offset = im.meta_at<int32_t>(im.off_score_offset);
  a.scores = static_cast<const float*>(im.scores.get());
  a.out = selection;
  a.max_candidates = im.max_candidates;
  M3_CHECK(im.max_candidates <= 40 * 1024, "top-k: {} candidate blocks exceed the 40960 supported",
           im.max_candidates);
  check_cuda(detail::launch_topk(a, stream), "top-k launch");
}

void MsaPlan::indexer_topk(const KvLayerView& cache, const void* index_q, ActDType q_dtype,
                           int32_t* selection, cudaStream_t stream) const {
  indexer_scores(cache, index_q, q_dtype, stream);
  topk(selection, stream);
}

void MsaPlan::attention(const KvLayerView& cache, const void* q, ActDType q_dtype,
                        const int32_t* selection, float sm_scale, uint16_t* out, float* lse,
                        cudaStream_t stream) const {
  const Impl& im = *impl_;
  M3_CHECK(cache.head_dim == detail::kDim && cache.num_kv_heads == im.config.num_kv_heads,
           "attention: cache geometry (head_dim {}, {} KV heads) differs from the plan's", cache.head_dim,
           cache.num_kv_heads);
  M3_CHECK(cache.kv_dtype != KvDType::kF32, "attention: float32 KV cache is CPU-only");
  M3_CHECK(selection != nullptr || im.config.dense, "attention: dense attention was not planned");
  detail::AttentionArgs a;
  a.cache = cache;
  a.step = im.step;
  a.q = q;
  a.q_kind = q_dtype == ActDType::kBF16 ? detail::ActKind::kBF16 : detail::ActKind::kE4M3;
  a.num_q_heads = im.config.num_q_heads;
  a.selection = selection;
  a.topk = im.config.indexer.topk_blocks;
  a.sm_scale = sm_scale;
  a.out = out;
  a.lse = lse;
  a.partial_o = static_cast<float*>(im.partial_o.get());
  a.partial_ml = static_cast<float*>(im.partial_ml.get());
  a.e4m3_table = im.e4m3_table();
  a.probe_skip_expand = im.probe.skip_kv_expand;
  detail::CombineArgs c;
  c.num_q_heads = im.config.num_q_heads;
  c.num_kv_heads = im.config.num_kv_heads;
  c.sm_scale = sm_scale;
  c.nvfp4 = cache.kv_dtype == KvDType::kNVFP4;
  c.partial_o = a.partial_o;
  c.partial_ml = a.partial_ml;
  c.out = out;
  c.lse = lse;
  if (selection) {
    a.work = im.meta_at<SparseWork>(im.off_sparse);
    a.num_work = im.stats.sparse_group_launch;
    a.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 3 : nullptr;
    // The wgmma kernels on the NVFP4 cache, not under the timing probe, which times the expanding
    // kernel; attention.cu's walks otherwise. The sparse rows kernel merges a row's splits itself,
    // so the combine launch then takes the row groups' merges alone (the head of the list).
    const bool wgmma = cache.kv_dtype == KvDType::kNVFP4 && !im.probe.skip_kv_expand;
    c.work = im.meta_at<CombineWork>(im.off_sparse_combine);
    c.num_work = wgmma ? im.stats.combine_sparse_group_launch : im.stats.combine_sparse_launch;
    c.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + (wgmma ? 6 : 4) : nullptr;
    a.combine_work = c.work;
    a.combine_done = static_cast<int32_t*>(im.combine_done.get());
    if (wgmma)
      check_cuda(detail::launch_sparse_groups(a, stream), "sparse attention launch (row groups)");
    else
      check_cuda(detail::launch_sparse_attention(a, stream), "sparse attention launch (row groups)");
    // Rows alone.
    a.work = im.meta_at<SparseWork>(im.off_sparse_rows);
    a.num_work = im.stats.sparse_row_launch;
    a.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 5 : nullptr;
    if (wgmma)
      check_cuda(detail::launch_sparse_rows(a, stream), "sparse attention launch (rows)");
    else
      check_cuda(detail::launch_sparse_attention(a, stream), "sparse attention launch (rows)");
  } else {
    a.work = im.meta_at<DenseWork>(im.off_dense);
    a.num_work = im.stats.dense_launch;
    a.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 1 : nullptr;
    c.work = im.meta_at<CombineWork>(im.off_dense_combine);
    c.num_work = im.stats.combine_dense_launch;
    c.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 2 : nullptr;
    check_cuda(detail::launch_dense_attention(a, stream), "dense attention launch");
  }
  check_cuda(detail::launch_combine(c, stream), "attention combine launch");
}

}  // namespace m3::cuda
