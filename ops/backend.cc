#include "ops/backend.h"

#include <vector>

#include "core/error.h"

namespace m3 {

void Backend::sample(const Tensor& logits, const SampleBatch& batch, int32_t* ids, RowLogprobs* logprobs) {
  if (batch.rows.empty() && batch.logprobs.empty()) return;
  M3_CHECK(logits.ndim() == 2, "sample: logits must be [rows, vocab], got {}", shape_string(logits.shape()));
  const auto vocab = static_cast<int32_t>(logits.dim(1));
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  copy_to_host_f32(logits, host.data());
  SampleWorkspace ws;
  sample_batch_reference(host.data(), logits.dim(0), vocab, batch, ids, ws);
  logprobs_batch_reference(host.data(), logits.dim(0), vocab, batch, ids, logprobs);
}

Tensor Backend::alloc_kv_host_tier(int64_t bytes, std::string_view what) {
  fail("backend {}: no host tier for KV blocks ({} of {} bytes asked for)", name(), what, bytes);
}

double Backend::measure_copy_rate(int64_t bytes, int) {
  fail("backend {}: cannot measure its copy rate ({} bytes asked for)", name(), bytes);
}

void Backend::copy_kv_blocks(const Tensor&, const Tensor&, int64_t, const KvBlockCopies& copies) {
  fail("backend {}: cannot copy KV blocks to or from host memory ({} out, {} in)", name(),
       copies.to_host.size() + copies.to_host_ahead.size(), copies.to_device.size());
}

void check_kv_block_copies(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies) {
  M3_CHECK(block_bytes > 0, "copy_kv_blocks: block_bytes must be positive, got {}", block_bytes);
  M3_CHECK(pool.defined() && host.defined() && pool.dtype() == DType::kU8 && host.dtype() == DType::kU8,
           "copy_kv_blocks: the pool and the host tier must be U8 tensors");
  const int64_t blocks = static_cast<int64_t>(pool.nbytes()) / block_bytes;
  const int64_t slots = static_cast<int64_t>(host.nbytes()) / block_bytes;
  for (const auto* list : {&copies.to_host, &copies.to_device, &copies.to_host_ahead}) {
    for (const KvBlockCopy& c : *list) {
      M3_CHECK(c.block >= 0 && c.block < blocks && c.host_slot >= 0 && c.host_slot < slots,
               "copy_kv_blocks: block {} <-> host slot {} outside the pool of {} blocks / the host tier of {} slots",
               c.block, c.host_slot, blocks, slots);
    }
  }
}

void check_indexer_candidates_args(int tokens, const KvLayerView& cache, const Tensor& index_q_parts,
                                   int parts, const IndexerParams& params, int cp_size, int cp_rank,
                                   const Tensor& candidates) {
  M3_CHECK(parts >= 1 && cp_size >= 1 && cp_rank >= 0 && cp_rank < cp_size,
           "indexer_topk_candidates: {} parts, rank {} of a cp group of {}", parts, cp_rank, cp_size);
  M3_CHECK(cache.index_dim > 0 && params.index_heads > 0 && params.topk_blocks > 0,
           "indexer_topk_candidates: index dim {}, {} index heads, top-{} (a sparse layer needs all three)",
           cache.index_dim, params.index_heads, params.topk_blocks);
  M3_CHECK(index_q_parts.defined() && index_q_parts.ndim() == 2 && index_q_parts.dim(0) == int64_t(parts) * tokens &&
               index_q_parts.dim(1) == int64_t(params.index_heads) * cache.index_dim,
           "indexer_topk_candidates: gathered index queries must be [{} parts x {} tokens, {} heads x {}], got {}",
           parts, tokens, params.index_heads, cache.index_dim,
           index_q_parts.defined() ? shape_string(index_q_parts.shape()) : "undefined");
  const int64_t n = int64_t(parts) * tokens * params.index_heads * params.topk_blocks;
  M3_CHECK(candidates.defined() && candidates.dtype() == DType::kI64 && candidates.numel() == n,
           "indexer_topk_candidates: candidates must be I64 [{}, {}, {}, {}], got {} {}", parts, tokens,
           params.index_heads, params.topk_blocks, candidates.defined() ? dtype_name(candidates.dtype()) : "undefined",
           candidates.defined() ? shape_string(candidates.shape()) : "");
}

void check_merge_candidates_args(int tokens, const Tensor& gathered, int cp_size, int parts, int part,
                                 const IndexerParams& params, const Tensor& selection) {
  M3_CHECK(parts >= 1 && cp_size >= 1 && part >= 0 && part < parts,
           "merge_topk_candidates: part {} of {}, cp group of {}", part, parts, cp_size);
  const int64_t row = int64_t(tokens) * params.index_heads * params.topk_blocks;
  M3_CHECK(gathered.defined() && gathered.dtype() == DType::kI64 && gathered.numel() == int64_t(cp_size) * parts * row,
           "merge_topk_candidates: gathered candidates must be I64 [{}, {}, {}, {}, {}], got {} {}", cp_size, parts,
           tokens, params.index_heads, params.topk_blocks, gathered.defined() ? dtype_name(gathered.dtype()) : "undefined",
           gathered.defined() ? shape_string(gathered.shape()) : "");
  M3_CHECK(selection.defined() && selection.dtype() == DType::kI32 && selection.numel() == row,
           "merge_topk_candidates: selection must be I32 [{}, {}, {}], got {} {}", tokens, params.index_heads,
           params.topk_blocks, selection.defined() ? dtype_name(selection.dtype()) : "undefined",
           selection.defined() ? shape_string(selection.shape()) : "");
}

void check_draft_block_args(const StepView& step, const KvLayerView& cache, int num_q_heads, int block_len, int window) {
  M3_CHECK(block_len >= 1 && step.num_tokens == step.num_seqs * block_len,
           "draft_block_attention: {} planned tokens are not {} blocks of {}", step.num_tokens, step.num_seqs, block_len);
  M3_CHECK(window >= 1, "draft_block_attention: window {} must be positive", window);
  M3_CHECK(cache.num_kv_heads > 0 && num_q_heads % cache.num_kv_heads == 0,
           "draft_block_attention: {} query heads over {} KV heads", num_q_heads, cache.num_kv_heads);
  M3_CHECK(cache.kv_dtype != KvDType::kNVFP4, "draft_block_attention: a {} cache (f32, bf16 or fp8 only)",
           kv_dtype_name(cache.kv_dtype));
}

MarkovHeadView check_markov_drafts_args(const StepView& step, int num_logit_rows, const Tensor& base_logits,
                                        const Tensor& normed, const MarkovHeadWeights& head, int block_len) {
  M3_CHECK(block_len >= 1 && step.num_seqs >= 1 && step.num_tokens % step.num_seqs == 0 &&
               block_len <= step.num_tokens / step.num_seqs && num_logit_rows == step.num_seqs * block_len,
           "markov_drafts: {} logits rows are not {} blocks of {} (of blocks of {} queries)", num_logit_rows,
           step.num_seqs, block_len, step.num_seqs ? step.num_tokens / step.num_seqs : 0);
  M3_CHECK(head.w1.defined() && head.w2.defined() && head.w1.ndim() == 2 && head.w1.shape() == head.w2.shape() &&
               head.w1.dtype() == DType::kF32 && head.w2.dtype() == DType::kF32,
           "markov_drafts: w1 and w2 must be F32 [vocab, rank] alike");
  MarkovHeadView v;
  v.vocab = head.w1.dim(0);
  v.rank = static_cast<int>(head.w1.dim(1));
  M3_CHECK(base_logits.ndim() == 2 && base_logits.dim(0) == num_logit_rows && base_logits.dim(1) == v.vocab,
           "markov_drafts: base logits {} for {} rows of {} logits", shape_string(base_logits.shape()), num_logit_rows,
           v.vocab);
  M3_CHECK(normed.ndim() == 2 && normed.dim(0) == num_logit_rows, "markov_drafts: normed rows {} for {} rows",
           shape_string(normed.shape()), num_logit_rows);
  v.hidden = normed.dim(1);
  v.confidence_with_markov = head.confidence_with_markov;
  v.confidence_b = head.confidence_b;
  M3_CHECK(head.confidence_w.defined() && head.confidence_w.dtype() == DType::kF32 &&
               head.confidence_w.numel() == v.hidden + (v.confidence_with_markov ? v.rank : 0),
           "markov_drafts: the confidence weight must be F32 [{}]", v.hidden + (v.confidence_with_markov ? v.rank : 0));
  v.w1 = head.w1.data_as<const float>();
  v.w2 = head.w2.data_as<const float>();
  v.confidence_w = head.confidence_w.data_as<const float>();
  return v;
}

}  // namespace m3
