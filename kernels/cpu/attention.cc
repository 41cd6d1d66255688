#include "kernels/cpu/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "formats/rows.h"
#include "kernels/cpu/cpu_vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace m3 {
namespace {

using cpu::add_scaled;
using cpu::dot;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

void encode_row(KvDType dtype, const float* x, int dim, uint8_t* data, uint8_t* scales) {
  switch (dtype) {
    case KvDType::kF32:
      std::memcpy(data, x, sizeof(float) * dim);
      return;
    case KvDType::kBF16:
      for (int i = 0; i < dim; ++i) {
        const uint16_t h = bf16_encode(x[i]);
        std::memcpy(data + 2 * i, &h, 2);
      }
      return;
    case KvDType::kFP8:
      for (int i = 0; i < dim; ++i) data[i] = fp8_e4m3_encode(x[i]);
      return;
    case KvDType::kNVFP4:
      for (int g = 0; g < dim / kNvfp4Group; ++g)
        nvfp4_kv_encode_group(x + g * kNvfp4Group, data + g * kNvfp4Group / 2, scales + g);
      return;
  }
}

struct TokenView {
  int seq;
  int pos;
  const int32_t* pages;  // this sequence's page-table row
};

TokenView token_view(const StepView& b, int t) {
  const int s = b.token_seq[t];
  return {s, b.positions[t], b.page_table + int64_t(s) * b.pages_per_seq};
}

// code * scale (and its E4M3 rounding, the Q8KV4 view) for every (scale byte, code) pair: an
// exact table of the same function, so decoding a row costs a lookup per element.
struct Nvfp4Tables {
  std::array<float, 256 * 16> value, e4m3_view;
  Nvfp4Tables() {
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c) {
        value[s * 16 + c] = nvfp4_value(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
        e4m3_view[s * 16 + c] = nvfp4_value_e4m3(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
      }
  }
};

const Nvfp4Tables& nvfp4_tables() {
  static const Nvfp4Tables tables;
  return tables;
}

const float* nvfp4_table(bool e4m3_view) {
  return e4m3_view ? nvfp4_tables().e4m3_view.data() : nvfp4_tables().value.data();
}

// A loop over the rows of one block's slot fetches the next block's slot (`next`, null: none) a
// slice per row: that slot is elsewhere in the pool (a block holds every layer), where the
// hardware prefetchers would find it only after a few misses a page.
inline void prefetch_slice(const uint8_t* next, int64_t slot_bytes, int row, int block_rows) {
  if (next == nullptr) return;
  for (int64_t b = row * slot_bytes / block_rows; b < (row + 1) * slot_bytes / block_rows; b += 64)
    __builtin_prefetch(next + b);
}

void decode_row_portable(KvDType dtype, const uint8_t* data, const uint8_t* scales, int dim, bool e4m3_view,
                         float* out) {
  switch (dtype) {
    case KvDType::kF32:
      std::memcpy(out, data, sizeof(float) * dim);
      return;
    case KvDType::kBF16:
      for (int i = 0; i < dim; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = bf16_decode(h);
      }
      return;
    case KvDType::kFP8: {
      const auto& table = fp8_e4m3_table();
      for (int i = 0; i < dim; ++i) out[i] = table[data[i]];
      return;
    }
    case KvDType::kNVFP4: {
      const float* table = nvfp4_table(e4m3_view);
      for (int i = 0; i < dim; ++i) out[i] = table[scales[i / kNvfp4Group] * 16 + nvfp4_code_at(data, i)];
      return;
    }
  }
}

#if defined(__x86_64__)
// The same table values as the loops below, a group's 16 (its scale's row of the table) at a time.
__attribute__((target("avx2"))) void nvfp4_row_avx2(const float* table, const uint8_t* data,
                                                    const uint8_t* scales, int dim, float* out) {
  for (int g = 0; g < dim / kNvfp4Group; ++g) {
    const float* t = table + scales[g] * 16;
    __m256 v[2];
    cpu::nvfp4_group_lookup_avx2(data + g * kNvfp4Group / 2, _mm256_loadu_ps(t), _mm256_loadu_ps(t + 8), v);
    _mm256_storeu_ps(out + g * kNvfp4Group, v[0]);
    _mm256_storeu_ps(out + g * kNvfp4Group + 8, v[1]);
  }
}

__attribute__((target("avx2"))) void decode_row_avx2(KvDType dtype, const uint8_t* data, const uint8_t* scales,
                                                    int dim, bool e4m3_view, float* out) {
  if (dtype == KvDType::kBF16) return cpu::bf16_to_f32_avx2(data, dim, out);
  if (dtype == KvDType::kNVFP4 && dim % kNvfp4Group == 0)
    return nvfp4_row_avx2(nvfp4_table(e4m3_view), data, scales, dim, out);
  decode_row_portable(dtype, data, scales, dim, e4m3_view, out);
}

// The row loops of the indexer's block scores and of paged attention's two passes, compiled for
// AVX2 so that the decode and the dot products inline (the portable loops are in the ops below).
// Dot products run eight rows at a time (cpu::dots_avx2: the same sums side by side).
constexpr int kRowsAtOnce = 8;
constexpr int kMaxRowsDim = 256;  // rows this long or shorter go eight at a time

// max_dots (below) for AVX2: rows eight at a time, each head's maxima in row order.
__attribute__((target("avx2"))) void max_dots_avx2(const float* keys, int rows, int di, const float* q, int heads,
                                                  float* score, int64_t stride) {
  int r = 0;
  for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce) {
    const float* row_ptrs[kRowsAtOnce];
    for (int i = 0; i < kRowsAtOnce; ++i) row_ptrs[i] = keys + size_t(r + i) * di;
    for (int j = 0; j < heads; ++j) {
      float sums[kRowsAtOnce];
      cpu::dots_avx2<kRowsAtOnce>(q + size_t(j) * di, row_ptrs, di, sums);
      for (int i = 0; i < kRowsAtOnce; ++i) score[j * stride] = std::max(score[j * stride], sums[i]);
    }
  }
  for (; r < rows; ++r)
    for (int j = 0; j < heads; ++j)
      score[j * stride] = std::max(score[j * stride], cpu::dot_avx2(q + size_t(j) * di, keys + size_t(r) * di, di));
}

__attribute__((target("avx2"))) void index_rows_avx2(const KvLayerView& cache, int64_t phys, int rows,
                                                    const uint8_t* next, const float* q, int heads, float* key,
                                                    float* score, int64_t stride) {
  const int di = cache.index_dim, bs = cache.block_size;
  auto decode = [&](int r, float* out) {
    prefetch_slice(next, cache.index_slot_bytes(), r, bs);
    decode_row_avx2(cache.index_dtype, cache.index_row(phys, r), cache.index_row_scales(phys, r), di, true, out);
  };
  int r = 0;
  if (di <= kMaxRowsDim) {
    alignas(32) float keys[kRowsAtOnce * kMaxRowsDim];
    for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce) {
      for (int i = 0; i < kRowsAtOnce; ++i) decode(r + i, keys + i * di);
      max_dots_avx2(keys, kRowsAtOnce, di, q, heads, score, stride);
    }
  }
  for (; r < rows; ++r) {
    decode(r, key);
    max_dots_avx2(key, 1, di, q, heads, score, stride);
  }
}

// Pass 1 (which = 0): logits[h * n + key0 + r] = q_h . K_r; pass 2 (which = 1): acc_h += p_h,r V_r.
__attribute__((target("avx2"))) void attention_rows_avx2(const KvLayerView& cache, int64_t phys, int which, int g,
                                                        int rows, const uint8_t* next, bool q8kv4, int group,
                                                        const float* qg, float* logits, int n, int key0,
                                                        float* row, float* acc) {
  const int d = cache.head_dim, bs = cache.block_size;
  auto decode = [&](int r, float* out) {
    prefetch_slice(next, cache.kv_slot_bytes(), r, bs);
    decode_row_avx2(cache.kv_dtype, cache.kv_row(phys, which, g, r), cache.kv_row_scales(phys, which, g, r), d,
                    q8kv4, out);
  };
  int r = 0;
  if (d <= kMaxRowsDim) {
    alignas(32) float keys[kRowsAtOnce * kMaxRowsDim];
    const float* row_ptrs[kRowsAtOnce];
    for (int i = 0; i < kRowsAtOnce; ++i) row_ptrs[i] = keys + i * d;
    for (; r + kRowsAtOnce <= rows; r += kRowsAtOnce) {
      for (int i = 0; i < kRowsAtOnce; ++i) decode(r + i, keys + i * d);
      for (int h = 0; h < group; ++h) {
        float* l = logits + size_t(h) * n + key0 + r;
        if (which == 0)
          cpu::dots_avx2<kRowsAtOnce>(qg + size_t(h) * d, row_ptrs, d, l);
        else
          cpu::add_scaled_rows_avx2<kRowsAtOnce>(l, row_ptrs, acc + size_t(h) * d, d);
      }
    }
  }
  for (; r < rows; ++r) {
    decode(r, row);
    if (which == 0)
      for (int h = 0; h < group; ++h) logits[size_t(h) * n + key0 + r] = cpu::dot_avx2(qg + size_t(h) * d, row, d);
    else
      for (int h = 0; h < group; ++h) cpu::add_scaled_avx2(logits[size_t(h) * n + key0 + r], row, acc + size_t(h) * d, d);
  }
}
#endif

// score[j * stride] = max(score[j * stride], dot(q_j, key_r)) over rows r < rows in order, for the
// heads j of q [heads, di] and keys [rows, di]: a block's score for one query.
void max_dots_portable(const float* keys, int rows, int di, const float* q, int heads, float* score,
                       int64_t stride) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < heads; ++j)
      score[j * stride] = std::max(score[j * stride], cpu::dot_portable(q + size_t(j) * di, keys + size_t(r) * di, di));
}

void max_dots(const float* keys, int rows, int di, const float* q, int heads, float* score, int64_t stride) {
#if defined(__x86_64__)
  if (cpu::vec_avx2()) return max_dots_avx2(keys, rows, di, q, heads, score, stride);
#endif
  max_dots_portable(keys, rows, di, q, heads, score, stride);
}

}  // namespace

void cpu_kv_decode_row(KvDType dtype, const uint8_t* data, const uint8_t* scales, int dim,
                       bool e4m3_view, float* out) {
#if defined(__x86_64__)
  if (cpu::vec_avx2()) return decode_row_avx2(dtype, data, scales, dim, e4m3_view, out);
#endif
  decode_row_portable(dtype, data, scales, dim, e4m3_view, out);
}

void cpu_kv_insert(const StepView& batch, const KvLayerView& cache, const float* k,
                   const float* v, const float* index_k) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim, di = cache.index_dim;
#pragma omp parallel for schedule(static) if (batch.num_tokens >= 64)
  for (int t = 0; t < batch.num_tokens; ++t) {
    const int32_t slot = batch.slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / cache.block_size;
    const int row = slot % cache.block_size;
    for (int h = 0; h < hkv; ++h) {
      const int64_t off = (int64_t(t) * hkv + h) * d;
      encode_row(cache.kv_dtype, k + off, d, cache.kv_row(block, 0, h, row),
                 cache.kv_row_scales(block, 0, h, row));
      encode_row(cache.kv_dtype, v + off, d, cache.kv_row(block, 1, h, row),
                 cache.kv_row_scales(block, 1, h, row));
    }
    if (di > 0 && index_k != nullptr)
      encode_row(cache.index_dtype, index_k + int64_t(t) * di, di, cache.index_row(block, row),
                 cache.index_row_scales(block, row));
  }
}

float cpu_index_query_value(KvDType index_dtype, float x) {
  return e4m3_queries(index_dtype) ? fp8_e4m3_round(x) : x;
}

void cpu_indexer_block_scores(const KvLayerView& cache, const int32_t* pages, int pos, int block,
                              const float* q, int heads, float* key, float* score, int64_t stride) {
  const int di = cache.index_dim, bs = cache.block_size;
  const int64_t phys = pages[block];
  const int rows = std::min(bs, pos - block * bs + 1);
  const uint8_t* next = block < pos / bs ? cache.index_slot(pages[block + 1]) : nullptr;
  for (int j = 0; j < heads; ++j) score[j * stride] = kNegInf;
#if defined(__x86_64__)
  if (cpu::vec_avx2()) return index_rows_avx2(cache, phys, rows, next, q, heads, key, score, stride);
#endif
  for (int r = 0; r < rows; ++r) {
    prefetch_slice(next, cache.index_slot_bytes(), r, bs);
    cpu_kv_decode_row(cache.index_dtype, cache.index_row(phys, r), cache.index_row_scales(phys, r),
                      di, /*e4m3_view=*/true, key);
    for (int j = 0; j < heads; ++j)
      score[j * stride] = std::max(score[j * stride], dot(q + size_t(j) * di, key, di));
  }
}

void cpu_indexer_topk(const StepView& batch, const KvLayerView& cache,
                      const float* index_q, const IndexerParams& params, int32_t* out) {
  const int hi = params.index_heads, di = cache.index_dim, bs = cache.block_size;
  const int topk = params.topk_blocks;
  // Tiles of consecutive tokens of one sequence (a prefill chunk's rows): each block is decoded
  // once per tile, not once per token. A score is the same function of (query, block) as
  // cpu_indexer_block_scores' (the DCP candidates rely on it): the max over the token's visible
  // rows, in row order, of the same dot products.
  constexpr int kTokenTile = 16;
  std::vector<int> tile_begin;
  for (int t = 0; t < batch.num_tokens; ++t)
    if (tile_begin.empty() || t - tile_begin.back() == kTokenTile || batch.token_seq[t] != batch.token_seq[t - 1])
      tile_begin.push_back(t);
  tile_begin.push_back(batch.num_tokens);
  const int tiles = static_cast<int>(tile_begin.size()) - 1;
#pragma omp parallel if (tiles > 1)
  {
    std::vector<float> q, keys(size_t(bs) * di), score;
    std::vector<int> order;
#pragma omp for schedule(dynamic, 1)
    for (int tile = 0; tile < tiles; ++tile) {
      const int t0 = tile_begin[tile], count = tile_begin[tile + 1] - t0;
      const TokenView first = token_view(batch, t0);
      int max_visible = 0;
      for (int i = 0; i < count; ++i) max_visible = std::max(max_visible, batch.positions[t0 + i] / bs + 1);
      q.resize(size_t(count) * hi * di);
      for (size_t i = 0; i < q.size(); ++i)
        q[i] = cpu_index_query_value(cache.index_dtype, index_q[int64_t(t0) * hi * di + int64_t(i)]);
      // score[(i * hi + j) * max_visible + b]
      score.assign(size_t(count) * hi * max_visible, kNegInf);
      // A tile of one token (decode) scores each row as it is decoded, with the rows in cache.
      for (int b = 0; count == 1 && b < max_visible; ++b)
        cpu_indexer_block_scores(cache, first.pages, first.pos, b, q.data(), hi, keys.data(), score.data() + b,
                                 max_visible);
      for (int b = 0; count > 1 && b < max_visible; ++b) {
        int rows = 0;  // rows of block b that some token of the tile sees
        for (int i = 0; i < count; ++i) rows = std::max(rows, std::min(bs, batch.positions[t0 + i] - b * bs + 1));
        const int64_t phys = first.pages[b];
        const uint8_t* next = b + 1 < max_visible ? cache.index_slot(first.pages[b + 1]) : nullptr;
        for (int r = 0; r < rows; ++r) {
          prefetch_slice(next, cache.index_slot_bytes(), r, bs);
          cpu_kv_decode_row(cache.index_dtype, cache.index_row(phys, r), cache.index_row_scales(phys, r), di,
                            /*e4m3_view=*/true, keys.data() + size_t(r) * di);
        }
        for (int i = 0; i < count; ++i) {
          const int token_rows = std::min(bs, batch.positions[t0 + i] - b * bs + 1);
          if (token_rows > 0)
            max_dots(keys.data(), token_rows, di, q.data() + size_t(i) * hi * di, hi,
                     score.data() + size_t(i) * hi * max_visible + b, max_visible);
        }
      }
      for (int i = 0; i < count; ++i) {
        const int t = t0 + i;
        const TokenView tv = token_view(batch, t);
        const int local = tv.pos / bs;
        const int visible = local + 1;
        const int seq_blocks = (batch.seq_lens[tv.seq] + bs - 1) / bs;
        const int keep = std::min(topk, seq_blocks);
        for (int j = 0; j < hi; ++j) {
          float* s = score.data() + (size_t(i) * hi + j) * max_visible;
          for (int l = 0; l < params.local_blocks; ++l) s[std::max(local - l, 0)] = kPosInf;
          for (int b = 0; b < std::min(params.init_blocks, visible); ++b) s[b] = kPosInf;
          order.resize(visible);
          std::iota(order.begin(), order.end(), 0);
          const int n = std::min(keep, visible);
          std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int a, int b) {
            return s[a] > s[b] || (s[a] == s[b] && a < b);
          });
          int32_t* o = out + (int64_t(t) * hi + j) * topk;
          int w = 0;
          for (int k = 0; k < n; ++k)
            if (s[order[k]] != kNegInf) o[w++] = order[k];
          for (; w < topk; ++w) o[w] = -1;
        }
      }
    }
  }
}

void cpu_paged_attention(const StepView& batch, const KvLayerView& cache,
                         const float* q, int num_q_heads, const int32_t* selection, int topk,
                         float sm_scale, float* out, float* lse) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim, bs = cache.block_size;
  const int group = num_q_heads / hkv;
  const bool q8kv4 = cache.kv_dtype == KvDType::kNVFP4;
#pragma omp parallel if (batch.num_tokens * hkv >= 8)
  {
    std::vector<float> qg(size_t(group) * d), row(d), logits, acc(size_t(group) * d);
    std::vector<int> blocks;
    std::vector<char> chosen;
#pragma omp for collapse(2) schedule(dynamic, 2)
    for (int t = 0; t < batch.num_tokens; ++t) {
      for (int g = 0; g < hkv; ++g) {
        const TokenView tv = token_view(batch, t);
        const int local = tv.pos / bs;
        // The visible blocks: all of 0..local, or the selected ones (a union: -1 and repeats ignored).
        blocks.clear();
        if (selection == nullptr) {
          for (int b = 0; b <= local; ++b) blocks.push_back(b);
        } else {
          chosen.assign(local + 1, 0);
          const int32_t* sel = selection + (int64_t(t) * hkv + g) * topk;
          for (int i = 0; i < topk; ++i)
            if (sel[i] >= 0 && sel[i] <= local) chosen[sel[i]] = 1;
          for (int b = 0; b <= local; ++b)
            if (chosen[b]) blocks.push_back(b);
        }
        for (int h = 0; h < group; ++h)
          for (int c = 0; c < d; ++c) {
            const float x = q[(int64_t(t) * num_q_heads + g * group + h) * d + c];
            qg[size_t(h) * d + c] = q8kv4 ? fp8_e4m3_round(x) : x;
          }
        // Pass 1: raw dot products q.k of every visible key, per head of the group.
        int n = 0;
        for (int b : blocks) n += std::min(bs, tv.pos - b * bs + 1);
        logits.assign(size_t(group) * n, 0.0f);
        int key = 0;
        for (size_t bi = 0; bi < blocks.size(); ++bi) {
          const int b = blocks[bi];
          const int64_t phys = tv.pages[b];
          const int rows = std::min(bs, tv.pos - b * bs + 1);
          const uint8_t* next = bi + 1 < blocks.size() ? cache.kv_slot(tv.pages[blocks[bi + 1]], 0, g) : nullptr;
#if defined(__x86_64__)
          if (cpu::vec_avx2()) {
            attention_rows_avx2(cache, phys, 0, g, rows, next, q8kv4, group, qg.data(), logits.data(), n, key,
                                row.data(), nullptr);
            key += rows;
            continue;
          }
#endif
          for (int r = 0; r < rows; ++r, ++key) {
            prefetch_slice(next, cache.kv_slot_bytes(), r, bs);
            cpu_kv_decode_row(cache.kv_dtype, cache.kv_row(phys, 0, g, r),
                              cache.kv_row_scales(phys, 0, g, r), d, q8kv4, row.data());
            for (int h = 0; h < group; ++h)
              logits[size_t(h) * n + key] = dot(qg.data() + size_t(h) * d, row.data(), d);
          }
        }
        // Softmax weights per head (fp32): plain, or the Q8KV4 probability path.
        std::vector<float> maxes(group, kNegInf), sums(group, 0.0f);
        for (int h = 0; h < group; ++h) {
          float* l = logits.data() + size_t(h) * n;
          float m = kNegInf;
          if (q8kv4) {
            for (int i = 0; i < n; ++i) m = std::max(m, l[i]);
            float sum = 0.0f;
            for (int i = 0; i < n; ++i) {
              const float e = 448.0f * std::exp(sm_scale * (l[i] - m));
              sum += e;
              l[i] = fp8_e4m3_round(e);  // P8 multiplies V; the normaliser keeps e unquantised
            }
            maxes[h] = sm_scale * m;
            sums[h] = sum / 448.0f;
            for (int i = 0; i < n; ++i) l[i] /= sum;
          } else {
            for (int i = 0; i < n; ++i) {
              l[i] *= sm_scale;
              m = std::max(m, l[i]);
            }
            float sum = 0.0f;
            for (int i = 0; i < n; ++i) {
              l[i] = std::exp(l[i] - m);
              sum += l[i];
            }
            maxes[h] = m;
            sums[h] = sum;
            for (int i = 0; i < n; ++i) l[i] /= sum;
          }
        }
        // Pass 2: weighted sum of V.
        std::fill(acc.begin(), acc.end(), 0.0f);
        key = 0;
        for (size_t bi = 0; bi < blocks.size(); ++bi) {
          const int b = blocks[bi];
          const int64_t phys = tv.pages[b];
          const int rows = std::min(bs, tv.pos - b * bs + 1);
          const uint8_t* next = bi + 1 < blocks.size() ? cache.kv_slot(tv.pages[blocks[bi + 1]], 1, g) : nullptr;
#if defined(__x86_64__)
          if (cpu::vec_avx2()) {
            attention_rows_avx2(cache, phys, 1, g, rows, next, q8kv4, group, nullptr, logits.data(), n, key,
                                row.data(), acc.data());
            key += rows;
            continue;
          }
#endif
          for (int r = 0; r < rows; ++r, ++key) {
            prefetch_slice(next, cache.kv_slot_bytes(), r, bs);
            cpu_kv_decode_row(cache.kv_dtype, cache.kv_row(phys, 1, g, r),
                              cache.kv_row_scales(phys, 1, g, r), d, q8kv4, row.data());
            for (int h = 0; h < group; ++h) {
              const float p = logits[size_t(h) * n + key];
              add_scaled(p, row.data(), acc.data() + size_t(h) * d, d);
            }
          }
        }
        for (int h = 0; h < group; ++h) {
          const int64_t qh = int64_t(t) * num_q_heads + g * group + h;
          std::memcpy(out + qh * d, acc.data() + size_t(h) * d, sizeof(float) * d);
          if (lse) lse[qh] = n > 0 ? maxes[h] + std::log(sums[h]) : kNegInf;
        }
      }
    }
  }
}

void cpu_draft_block_attention(const StepView& batch, const KvLayerView& cache, const float* q, int num_q_heads,
                               const float* block_k, const float* block_v, int block_len, int window,
                               float sm_scale, float* out) {
  const int hkv = cache.num_kv_heads, d = cache.head_dim, bs = cache.block_size;
  const int group = num_q_heads / hkv;
#pragma omp parallel if (batch.num_tokens * num_q_heads >= 16)
  {
    std::vector<float> key(d), logits, acc(d);
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int t = 0; t < batch.num_tokens; ++t) {
      for (int h = 0; h < num_q_heads; ++h) {
        const int s = t / block_len, g = h / group, pos = batch.positions[t];
        const int last = batch.seq_lens[s] - block_len - 1;  // the last context position
        const int first = std::max(0, pos - window + 1);
        const int32_t* pages = batch.page_table + int64_t(s) * batch.pages_per_seq;
        const float* qh = q + (int64_t(t) * num_q_heads + h) * d;
        const int context = std::max(0, last - first + 1), n = context + block_len;
        auto block_row = [&](const float* rows, int i) {
          return rows + ((int64_t(s) * block_len + i) * hkv + g) * d;
        };
        logits.resize(n);
        float m = kNegInf;
        for (int i = 0; i < n; ++i) {
          if (i < context) {
            const int p = first + i;
            const int64_t phys = pages[p / bs];
            cpu_kv_decode_row(cache.kv_dtype, cache.kv_row(phys, 0, g, p % bs), cache.kv_row_scales(phys, 0, g, p % bs),
                              d, false, key.data());
            logits[i] = dot(qh, key.data(), d) * sm_scale;
          } else {
            logits[i] = dot(qh, block_row(block_k, i - context), d) * sm_scale;
          }
          m = std::max(m, logits[i]);
        }
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) sum += (logits[i] = std::exp(logits[i] - m));
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int i = 0; i < n; ++i) {
          const float p = logits[i] / sum;
          const float* v = key.data();
          if (i < context) {
            const int kp = first + i;
            const int64_t phys = pages[kp / bs];
            cpu_kv_decode_row(cache.kv_dtype, cache.kv_row(phys, 1, g, kp % bs),
                              cache.kv_row_scales(phys, 1, g, kp % bs), d, false, key.data());
          } else {
            v = block_row(block_v, i - context);
          }
          add_scaled(p, v, acc.data(), d);
        }
        std::memcpy(out + (int64_t(t) * num_q_heads + h) * d, acc.data(), sizeof(float) * d);
      }
    }
  }
}

}  // namespace m3
