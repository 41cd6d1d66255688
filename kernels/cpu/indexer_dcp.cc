// The CPU reference of indexer decode context parallelism (ops/attention.h): the candidates of one
// rank's block slice and the merge of every rank's candidates. The scores come from the same
// function as cpu_indexer_topk's (cpu_indexer_block_scores), which is what makes the merged
// selection bitwise that of indexer_topk.
#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"

namespace m3 {
namespace {

constexpr float kPosInf = std::numeric_limits<float>::infinity();

// k of ops/attention.h: min(topk, ceil(seq_len / block_size)) for the token's sequence.
int keep_blocks(const StepView& batch, int t, const IndexerParams& params, int block_size) {
  const int seq_blocks = (batch.seq_lens[batch.token_seq[t]] + block_size - 1) / block_size;
  return std::min(params.topk_blocks, seq_blocks);
}

}  // namespace

void cpu_indexer_topk_candidates(const StepView& batch, const KvLayerView& cache,
                                 const float* index_q_parts, int parts, const IndexerParams& params,
                                 int cp_size, int cp_rank, int64_t* candidates) {
  const int hl = params.index_heads, heads = parts * hl, di = cache.index_dim, bs = cache.block_size;
  const int topk = params.topk_blocks, tokens = batch.num_tokens;
#pragma omp parallel if (tokens > 1)
  {
    std::vector<float> q(size_t(heads) * di), key(di), score;
    std::vector<int64_t> keys;
#pragma omp for schedule(dynamic, 4)
    for (int t = 0; t < tokens; ++t) {
      const int s = batch.token_seq[t], pos = batch.positions[t];
      const int32_t* pages = batch.page_table + int64_t(s) * batch.pages_per_seq;
      const int local = pos / bs;
      // Global head p*hl + h is head h of part p: its query is row p*T + t of the parts.
      for (int p = 0; p < parts; ++p)
        for (int i = 0; i < hl * di; ++i)
          q[(size_t(p) * hl) * di + i] =
              cpu_index_query_value(cache.index_dtype, index_q_parts[(int64_t(p) * tokens + t) * hl * di + i]);
      // This rank's slice of the visible blocks 0..local: cp_rank, cp_rank + cp_size, ...
      const int mine = local >= cp_rank ? (local - cp_rank) / cp_size + 1 : 0;
      score.resize(size_t(heads) * mine);
      for (int i = 0; i < mine; ++i)
        cpu_indexer_block_scores(cache, pages, pos, cp_rank + i * cp_size, q.data(), heads, key.data(),
                                 score.data() + i, mine);
      const int n = std::min(keep_blocks(batch, t, params, bs), mine);
      for (int g = 0; g < heads; ++g) {
        keys.resize(mine);
        for (int i = 0; i < mine; ++i) {
          const int b = cp_rank + i * cp_size;
          keys[i] = indexer_candidate_key(indexer_forced_block(b, local, params) ? kPosInf : score[size_t(g) * mine + i], b);
        }
        std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), std::greater<>());
        const int p = g / hl, h = g % hl;
        int64_t* out = candidates + ((int64_t(p) * tokens + t) * hl + h) * topk;
        std::copy(keys.begin(), keys.begin() + n, out);
        std::fill(out + n, out + topk, int64_t(0));
      }
    }
  }
}

void cpu_merge_topk_candidates(const StepView& batch, const int64_t* gathered, int cp_size,
                               int parts, int part, const IndexerParams& params, int32_t* selection) {
  const int hl = params.index_heads, topk = params.topk_blocks, tokens = batch.num_tokens;
  // k = min(topk, ceil(seq_len / block_size)) needs no step data here: when k < topk, every
  // visible block (at most ceil(seq_len / block_size) of them, as positions < seq_len) is among
  // the candidates and all of them are kept; otherwise k = topk.
  std::vector<int64_t> keys;
  std::vector<int32_t> ids;
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < hl; ++h) {
      keys.clear();
      for (int r = 0; r < cp_size; ++r) {
        const int64_t* row = gathered + (((int64_t(r) * parts + part) * tokens + t) * hl + h) * topk;
        for (int i = 0; i < topk; ++i)
          if (row[i] != 0) keys.push_back(row[i]);
      }
      const int n = std::min<int>(topk, static_cast<int>(keys.size()));
      std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), std::greater<>());
      ids.resize(n);
      for (int i = 0; i < n; ++i) ids[i] = indexer_candidate_block(keys[i]);
      std::sort(ids.begin(), ids.end());
      int32_t* out = selection + (int64_t(t) * hl + h) * topk;
      std::copy(ids.begin(), ids.end(), out);
      std::fill(out + n, out + topk, -1);
    }
}

}  // namespace m3
