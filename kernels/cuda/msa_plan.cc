// MsaPlan: per-step schedules for the MSA kernels (host side) and the per-layer launches.
//
// plan() turns the step's query ranges and positions into work lists (indexer row tiles x block
// chunks, sparse attention rows x slot splits, dense attention row groups x block chunks), sizes
// the workspaces, and uploads everything in one async copy from pinned memory. Chunk sizes aim at
// a few CTAs per multiprocessor so that small batches still fill the GPU (batch-invariant mode:
// splits that depend on each row alone, MsaConfig::batch_invariant).
#include "kernels/cuda/msa.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/msa_kernels.h"

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

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Splits (min_splits..max_splits) of `items` equal work items of `work` units each for `slots` CTAs that
// run at once, where a CTA also pays `overhead` units (its prologue, the pipeline's fill): the
// count whose waves come closest to the work, time ~ ceil(items * s / slots) * (work / s +
// overhead), the fewest on ties (each split costs a partial result and its merge).
int wave_splits(int64_t items, int64_t slots, int min_splits, int max_splits, double work, double overhead) {
  max_splits = std::max(min_splits, max_splits);
  if (items <= 0) return min_splits;
  int best = min_splits;
  double best_time = 1e300;
  for (int s = min_splits; s <= max_splits; ++s) {
    const double time = double((items * s + slots - 1) / slots) * (work / s + overhead);
    if (time < best_time * (1 - 1e-9)) best = s, best_time = time;
  }
  return best;
}

// Block chunk of the indexer's spans for `slots` CTAs at once: items of c blocks (a span's last
// one shorter), time ~ waves * (c + 1) (a block's worth of prologue per item), the largest chunk on
// ties. c >= total / (4 slots), so that the items stay within spans + 4 slots (graph mode's bound).
int indexer_chunk(const std::vector<int>& span_blocks, int64_t slots, int max_chunk) {
  int64_t total = 0;
  for (int b : span_blocks) total += b;
  const int min_chunk = std::clamp(ceil_div(total, 4 * slots), 1, max_chunk);
  int best = max_chunk;
  double best_time = 1e300;
  for (int c = max_chunk; c >= min_chunk; --c) {
    int64_t items = 0;
    for (int b : span_blocks) items += (b + c - 1) / c;
    const double time = double((items + slots - 1) / slots) * (c + 1);
    if (time < best_time * (1 - 1e-9)) best = c, best_time = time;
  }
  return best;
}

}  // namespace

struct MsaPlan::Impl {
  MsaConfig config;
  int num_sms = 0;
  // CTAs that run at once (SMs x CTAs per SM) of the indexer and of sparse attention, with the
  // NVFP4 caches the work lists are tuned for (other dtypes fit as many or fewer).
  // Rows alone run sparse_rows.cu's kernel on NVFP4 caches, groups attention.cu's.
  int indexer_slots = 0, sparse_rows_slots = 0, sparse_group_slots = 0;
  int64_t generation = 0;
  cudaEvent_t upload_done = nullptr;
  DeviceBuffer table, meta, scores, partial_o, partial_ml;
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
  impl_->indexer_slots = impl_->num_sms * detail::indexer_ctas_per_sm(KvDType::kNVFP4);
  impl_->sparse_rows_slots = impl_->num_sms * detail::sparse_rows_ctas_per_sm();
  impl_->sparse_group_slots = impl_->num_sms * detail::sparse_attention_ctas_per_sm(KvDType::kNVFP4);
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
  const int bs = cfg.block_size, hkv = cfg.num_kv_heads;
  M3_CHECK(static_cast<int>(host.positions.size()) == T && static_cast<int>(host.token_seq.size()) == T &&
               static_cast<int>(host.query_start.size()) == S + 1,
           "MSA plan: step arrays disagree (T={}, positions {}, token_seq {}, query_start {} for {} seqs)",
           T, host.positions.size(), host.token_seq.size(), host.query_start.size(), S);
  M3_CHECK(device.num_tokens == T && device.num_seqs == S, "MSA plan: device view has {} tokens / {} seqs, host {} / {}",
           device.num_tokens, device.num_seqs, T, S);
  const bool sparse = cfg.index_dim > 0;
  const int sms = im.num_sms;

  std::vector<int32_t> score_offset(T, 0);
  std::vector<IndexerWork> indexer;
  std::vector<SparseWork> sparse_groups, sparse_rows;
  std::vector<CombineWork> sparse_combine, dense_combine;
  std::vector<DenseWork> dense_work;
  int64_t score_entries = 0;
  int max_candidates = 1;
  for (int t = 0; t < T; ++t) {
    const int pos = host.positions[t];
    score_offset[t] = static_cast<int32_t>(score_entries);
    const int n = pos >= 0 ? pos / bs + 1 : 0;
    score_entries += n;
    max_candidates = std::max(max_candidates, n);
  }
  M3_CHECK(score_entries * std::max(1, ip.index_heads) < (int64_t(1) << 31),
           "MSA plan: {} score entries exceed the int32 offsets", score_entries);

  // Graph mode: upper bounds of the context-dependent lists for (T, S, P), from the chunking rules
  // below. A list of items over spans with chunk c = clamp(ceil(total / n), lo, hi) has at most
  // spans + total / c items, and total / c <= min(total, max(n, total / hi)) for every clamp case.
  const int graph_pages = graph_pages_per_seq;
  const bool graph = graph_pages > 0;
  int max_rows_per_seq = 1;
  for (int s = 0; s < S; ++s)
    max_rows_per_seq = std::max(max_rows_per_seq, host.query_start[s + 1] - host.query_start[s]);
  const int64_t bound_blocks = int64_t(T) * graph_pages;  // spans <= T, blocks per span <= P
  const int indexer_cap =
      graph ? T + static_cast<int>(std::min<int64_t>(
                      bound_blocks, std::max<int64_t>(4 * im.indexer_slots, ceil_div(bound_blocks, detail::kIndexerMaxBlocks))))
            : 0;
  const int dense_cap =
      graph ? T * hkv + std::max<int>(3 * sms, ceil_div(bound_blocks * hkv, detail::kDenseMaxBlocks)) : 0;
  const int dense_combine_cap = graph ? T * hkv : 0;
  const int64_t dense_partial_cap = int64_t(dense_cap) * std::min(4, max_rows_per_seq);
  int sparse_groups_cap = 0, sparse_rows_cap = 0, sparse_combine_cap = 0;  // set with the sparse schedule
  int64_t sparse_partial_cap = 0;
  if (graph)
    M3_CHECK(max_candidates <= graph_pages, "MSA plan (graph mode): a token sees {} blocks, the bucket has {}",
             max_candidates, graph_pages);

  if (sparse) {
    // Indexer: row tiles of <= 64 MMA rows, each against the blocks its rows may need scored.
    const int rows_per_item = detail::kIndexerRows / ip.index_heads;
    struct Span { int seq, row, count, blocks; };
    std::vector<Span> spans;
    for (int s = 0; s < S; ++s) {
      for (int r = host.query_start[s]; r < host.query_start[s + 1]; r += rows_per_item) {
        const int count = std::min(rows_per_item, host.query_start[s + 1] - r);
        const int last_pos = host.positions[r + count - 1];
        if (last_pos < 0) continue;
        const int local = last_pos / bs;
        if (local + 1 <= ip.topk_blocks) continue;  // every row keeps all its blocks
        const int blocks = ip.local_blocks >= 1 ? local - ip.local_blocks + 1 : local + 1;
        if (blocks <= 0) continue;
        spans.push_back({s, r, count, blocks});
      }
    }
    std::vector<int> span_blocks;
    for (const Span& sp : spans) span_blocks.push_back(sp.blocks);
    const int chunk = indexer_chunk(span_blocks, im.indexer_slots, detail::kIndexerMaxBlocks);
    for (const Span& sp : spans)
      for (int b = 0; b < sp.blocks; b += chunk)
        indexer.push_back({sp.seq, sp.row, sp.count, b, std::min(sp.blocks, b + chunk), {0, 0, 0}});

    // Sparse attention. The rows of a sequence of more than kSparseRowsAlone (a prefill chunk) go
    // in groups of 2-4 (one CTA reads a block the group's rows share once), each group's union of
    // selected blocks split into parts; the rows of shorter sequences (decode, draft tokens) go
    // alone, their slot ranges split: on NVFP4 caches they take the wgmma kernel, whose per-row
    // walk beats a group's when rows share few blocks (msa_bench, random selections), and whose
    // re-reads of blocks that rows do share mostly come from L2. Both split while the grid is
    // small. Batch-invariant mode keeps every row alone with the fewest slot splits: a group's
    // union, and a row's split count, would depend on the other rows of the step.
    const int topk = ip.topk_blocks;
    const int group_rows =
        cfg.batch_invariant ? 1 : std::min(detail::kSparseGroupRows, detail::kMaxGroupCandidates / topk);
    auto alone = [&](int q) { return q <= detail::kSparseRowsAlone || group_rows == 1; };
    int singles = 0, groups = 0;
    for (int s = 0; s < S; ++s) {
      const int q = host.query_start[s + 1] - host.query_start[s];
      if (alone(q)) singles += q;
      else groups += ceil_div(q, group_rows);
    }
    // Graph mode: the counts' bounds for (T, S): singles <= T, and a sequence of q >= 2 rows
    // makes at most q - 1 groups, so groups <= T - S.
    if (graph) {
      singles = T;
      groups = group_rows == 1 ? 0 : T - S;
    }
    // Work in tiles of 64 keys (a row's topk blocks); a CTA's prologue (its tile list, the query
    // tile, the pipeline's fill) costs about 4 tiles, a group's (the sort of its candidates)
    // about 10.
    const double row_tiles = double(topk) * (bs / detail::kTileTokens);
    // A row alone walks at most kMaxSlotsPerItem slots (its kernels' tile lists).
    const int min_splits = ceil_div(topk, detail::kMaxSlotsPerItem);
    const int splits = cfg.batch_invariant ? min_splits
                                           : wave_splits(int64_t(singles) * hkv, im.sparse_rows_slots, min_splits,
                                                         std::min(topk, 8), row_tiles, 4);
    const int parts = wave_splits(int64_t(groups) * hkv, im.sparse_group_slots, 1,
                                  std::min(16, std::max(1, group_rows * topk / 4)), group_rows * row_tiles, 10);
    const int per_split = ceil_div(topk, splits);
    int next_partial = 0;
    for (int s = 0; s < S; ++s) {
      const int r0 = host.query_start[s], q = host.query_start[s + 1] - r0;
      if (alone(q)) continue;
      const int n = ceil_div(q, group_rows);
      for (int k = 0; k < n; ++k) {  // near-equal groups: q = 5 -> 3 + 2, never a group of one
        const int row = r0 + int(int64_t(q) * k / n), count = r0 + int(int64_t(q) * (k + 1) / n) - row;
        for (int g = 0; g < hkv; ++g) {
          if (parts == 1) {
            sparse_groups.push_back({row, count, g, 0, 1, -1, 0, 0});
            continue;
          }
          for (int j = 0; j < parts; ++j)
            sparse_groups.push_back({row, count, g, j, parts, next_partial + j, parts, 0});
          for (int r = 0; r < count; ++r) sparse_combine.push_back({row + r, g, next_partial + r * parts, parts});
          next_partial += count * parts;
        }
      }
    }
    for (int s = 0; s < S; ++s) {
      const int r0 = host.query_start[s], q = host.query_start[s + 1] - r0;
      if (!alone(q)) continue;
      for (int t = r0; t < r0 + q; ++t)
        for (int g = 0; g < hkv; ++g) {
          if (splits == 1) {
            sparse_rows.push_back({t, 1, g, 0, topk, -1, 0, 0});
            continue;
          }
          for (int j = 0; j < splits; ++j)
            sparse_rows.push_back({t, 1, g, j * per_split, std::min(topk, (j + 1) * per_split), next_partial + j, 1, 0});
          sparse_combine.push_back({t, g, next_partial, splits});
          next_partial += splits;
        }
    }
    if (graph) {
      sparse_rows_cap = singles * hkv * splits;
      sparse_groups_cap = groups * hkv * parts;
      sparse_combine_cap = (splits > 1 || parts > 1) ? T * hkv : 0;
      sparse_partial_cap = int64_t(T) * hkv * std::max(splits, parts);
    }
    const int64_t sparse_partials = std::max<int64_t>(next_partial, sparse_partial_cap);
    im.stats.sparse_splits = splits;
    im.stats.sparse_parts = parts;
    if (im.partial_o.reserve(size_t(sparse_partials) * detail::kMaxGroup * detail::kDim * 4, "sparse partials")) ++im.generation;
    if (im.partial_ml.reserve(size_t(sparse_partials) * detail::kMaxGroup * 2 * 4, "sparse partials")) ++im.generation;
    const int64_t score_cap = graph ? std::max(score_entries, bound_blocks) : score_entries;
    if (im.scores.reserve(size_t(score_cap) * ip.index_heads * 4, "indexer scores")) ++im.generation;
  }

  if (cfg.dense) {
    // Batch-invariant mode: chunks of kDenseMaxBlocks blocks whatever the step, and a group of
    // rows (which shares its chunk boundaries and its pieces' combine) ends where the next row
    // would need another number of pieces, so that a row's split is a function of its own
    // position: inside a piece a row walks only the tiles up to its position, in order.
    const bool fixed = cfg.batch_invariant;
    auto pieces_at = [&](int pos) { return pos < 0 ? 0 : ceil_div(pos / bs + 1, detail::kDenseMaxBlocks); };
    struct Group { int seq, row, count, blocks; };
    std::vector<Group> groups;
    int64_t total_blocks = 0;
    for (int s = 0; s < S; ++s)
      for (int r = host.query_start[s], count = 0; r < host.query_start[s + 1]; r += count) {
        count = std::min(4, host.query_start[s + 1] - r);
        if (fixed) {
          int same = 1;
          while (same < count && pieces_at(host.positions[r + same]) == pieces_at(host.positions[r])) ++same;
          count = same;
        }
        const int last_pos = host.positions[r + count - 1];
        if (last_pos < 0) continue;
        groups.push_back({s, r, count, last_pos / bs + 1});
        total_blocks += int64_t(last_pos / bs + 1) * hkv;
      }
    const int chunk = fixed ? detail::kDenseMaxBlocks
                            : std::clamp(ceil_div(total_blocks, 3 * int64_t(sms)), 8, detail::kDenseMaxBlocks);
    int next_partial = 0;
    for (const Group& gr : groups)
      for (int g = 0; g < hkv; ++g) {
        const int pieces = ceil_div(gr.blocks, chunk);
        if (pieces == 1) {
          dense_work.push_back({gr.seq, gr.row, gr.count, g, 0, gr.blocks, -1, 0});
          continue;
        }
        for (int j = 0; j < pieces; ++j)
          dense_work.push_back({gr.seq, gr.row, gr.count, g, j * chunk, std::min(gr.blocks, (j + 1) * chunk),
                                next_partial + j, pieces});
        for (int r = 0; r < gr.count; ++r) dense_combine.push_back({gr.row + r, g, next_partial + r * pieces, pieces});
        next_partial += gr.count * pieces;
      }
    const int64_t partials = graph ? std::max<int64_t>(next_partial, dense_partial_cap) : next_partial;
    if (im.partial_o.reserve(size_t(partials) * detail::kMaxGroup * detail::kDim * 4, "dense partials")) ++im.generation;
    if (im.partial_ml.reserve(size_t(partials) * detail::kMaxGroup * 2 * 4, "dense partials")) ++im.generation;
  }
  if (graph)
    M3_CHECK(int(indexer.size()) <= indexer_cap && int(dense_work.size()) <= dense_cap &&
                 int(dense_combine.size()) <= dense_combine_cap && int(sparse_groups.size()) <= sparse_groups_cap &&
                 int(sparse_rows.size()) <= sparse_rows_cap && int(sparse_combine.size()) <= sparse_combine_cap,
             "MSA plan (graph mode): {} indexer / {} dense / {} combine / {} sparse group / {} sparse row / {} sparse "
             "combine items exceed the bounds {} / {} / {} / {} / {} / {}",
             indexer.size(), dense_work.size(), dense_combine.size(), sparse_groups.size(), sparse_rows.size(),
             sparse_combine.size(), indexer_cap, dense_cap, dense_combine_cap, sparse_groups_cap, sparse_rows_cap,
             sparse_combine_cap);

  Blob blob;
  // Item counts for graph mode's launches (which launch the bounds): indexer, dense, dense
  // combine, sparse groups, sparse combine, sparse rows.
  const std::vector<int32_t> counts = {static_cast<int32_t>(indexer.size()), static_cast<int32_t>(dense_work.size()),
                                       static_cast<int32_t>(dense_combine.size()),
                                       static_cast<int32_t>(sparse_groups.size()),
                                       static_cast<int32_t>(sparse_combine.size()),
                                       static_cast<int32_t>(sparse_rows.size())};
  im.off_counts = blob.add(counts);
  im.off_score_offset = blob.add(score_offset);
  im.off_indexer = blob.add(indexer, indexer_cap);
  im.off_sparse = blob.add(sparse_groups, sparse_groups_cap);
  im.off_sparse_rows = blob.add(sparse_rows, sparse_rows_cap);
  im.off_sparse_combine = blob.add(sparse_combine, sparse_combine_cap);
  im.off_dense = blob.add(dense_work, dense_cap);
  im.off_dense_combine = blob.add(dense_combine, dense_combine_cap);
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
  im.max_candidates = graph ? graph_pages : max_candidates;
  im.stats.indexer_items = static_cast<int>(indexer.size());
  im.stats.sparse_items = static_cast<int>(sparse_groups.size() + sparse_rows.size());
  im.stats.sparse_group_items = static_cast<int>(sparse_groups.size());
  im.stats.sparse_row_items = static_cast<int>(sparse_rows.size());
  im.stats.dense_items = static_cast<int>(dense_work.size());
  im.stats.combine_sparse = static_cast<int>(sparse_combine.size());
  im.stats.combine_dense = static_cast<int>(dense_combine.size());
  im.stats.indexer_launch = graph ? indexer_cap : im.stats.indexer_items;
  im.stats.sparse_group_launch = graph ? sparse_groups_cap : im.stats.sparse_group_items;
  im.stats.sparse_row_launch = graph ? sparse_rows_cap : im.stats.sparse_row_items;
  im.stats.combine_sparse_launch = graph ? sparse_combine_cap : im.stats.combine_sparse;
  im.stats.dense_launch = graph ? dense_cap : im.stats.dense_items;
  im.stats.combine_dense_launch = graph ? dense_combine_cap : im.stats.combine_dense;
  im.stats.score_entries = score_entries * std::max(0, ip.index_heads);
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
    c.work = im.meta_at<CombineWork>(im.off_sparse_combine);
    c.num_work = im.stats.combine_sparse_launch;
    c.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 4 : nullptr;
    check_cuda(detail::launch_sparse_attention(a, stream), "sparse attention launch (row groups)");
    // Rows alone: the wgmma kernel on the NVFP4 cache (not under the timing probe, which times the
    // expanding kernel), attention.cu's one-row walk otherwise.
    a.work = im.meta_at<SparseWork>(im.off_sparse_rows);
    a.num_work = im.stats.sparse_row_launch;
    a.device_num_work = im.graph ? im.meta_at<int32_t>(im.off_counts) + 5 : nullptr;
    if (cache.kv_dtype == KvDType::kNVFP4 && !im.probe.skip_kv_expand)
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
