#include "tests/kernels_cuda/attention_case.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace m3::test {
namespace {
constexpr float kEps = 1e-6f;
constexpr int kVocab = 1000;

// Bytes of one cached element of `dtype`, scales included (NVFP4: a scale per 16, FP8: per row).
double element_bytes(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: return 4;
    case KvDType::kBF16: return 2;
    case KvDType::kFP8: return 1;
    case KvDType::kNVFP4: return 0.5 + 1.0 / 16;
  }
  return 2;
}
}  // namespace

const char* attention_op_name(AttentionOp op) {
  switch (op) {
    case AttentionOp::kInput: return "attention_input";
    case AttentionOp::kInsert: return "kv_insert";
    case AttentionOp::kIndexer: return "indexer_topk";
    case AttentionOp::kSparse: return "paged_attention sparse";
    case AttentionOp::kDense: return "paged_attention dense";
  }
  return "?";
}

IndexerParams AttentionCase::indexer() const {
  IndexerParams p;
  p.index_heads = s_.geometry.index_heads;
  p.topk_blocks = s_.geometry.topk;
  p.local_blocks = s_.geometry.local_blocks;
  p.init_blocks = s_.geometry.init_blocks;
  return p;
}

void AttentionCase::build(std::mt19937_64& rng) {
  const Geometry& g = s_.geometry;
  step_ = make_step(s_.seqs, g.block_size, s_.layout, s_.shared_prefix_blocks, kVocab, rng);
  layout_ = KvLayout::make(g.block_size, g.kv_heads, g.head_dim, g.index_dim, s_.kv_dtype, s_.index_dtype, {true});
  const bool writes_cache = op_ == AttentionOp::kInput || op_ == AttentionOp::kInsert;
  pool_ = encode_pool(layout_, step_.batch, step_.num_blocks, !writes_cache, rng);
  const size_t t = tokens(), kv_cols = size_t(g.kv_heads) * g.head_dim;
  switch (op_) {
    case AttentionOp::kInput:
      q_ = random_values(rng, t * g.heads * g.head_dim, 2.0f);
      k_ = random_values(rng, t * kv_cols, 2.0f);
      v_ = random_values(rng, t * kv_cols, 1.0f);
      index_k_ = random_values(rng, t * g.index_dim, 2.0f);
      q_norm_ = random_f32(rng, g.head_dim, 0.3f);
      k_norm_ = random_f32(rng, g.head_dim, 0.3f);
      index_k_norm_ = random_f32(rng, g.index_dim, 0.3f);
      index_q_ = random_values(rng, t * g.index_heads * g.index_dim, 2.0f);
      index_q_norm_ = random_f32(rng, g.index_dim, 0.3f);
      break;
    case AttentionOp::kInsert:
      k_ = random_values(rng, t * kv_cols, 1.0f);
      v_ = random_values(rng, t * kv_cols, 1.0f);
      index_k_ = random_values(rng, t * g.index_dim, 1.0f);
      break;
    case AttentionOp::kIndexer:
      index_q_ = random_values(rng, t * g.index_heads * g.index_dim, 1.0f);
      break;
    case AttentionOp::kSparse:
      selection_ = random_selection(step_.batch, g.block_size, g.kv_heads, g.topk, rng);
      [[fallthrough]];
    case AttentionOp::kDense:
      q_ = random_values(rng, t * g.heads * g.head_dim, 1.0f);
      break;
  }
}

BoundCase AttentionCase::bind(Backend& b) const {
  const Geometry& g = s_.geometry;
  b.plan(step_.batch);
  const Tensor pool = on_backend(b, pool_);
  const KvLayerView cache = layout_.layer_view(pool.data_as<uint8_t>(), 0);
  const int64_t t = tokens(), q_cols = int64_t(g.heads) * g.head_dim, kv_cols = int64_t(g.kv_heads) * g.head_dim;
  Backend* be = &b;
  auto read_pool = [pool] { return Output(read_bytes(pool)); };
  // Every launch holds the pool: `cache` points into it.
  switch (op_) {
    case AttentionOp::kInput: {
      const Tensor q = act_on_backend(b, q_, t, q_cols), k = act_on_backend(b, k_, t, kv_cols);
      const Tensor v = act_on_backend(b, v_, t, kv_cols), ik = act_on_backend(b, index_k_, t, g.index_dim);
      const Tensor iq = act_on_backend(b, index_q_, t, int64_t(g.index_heads) * g.index_dim);
      AttentionInputs in;
      in.q = q;
      in.num_q_heads = g.heads;
      in.k = k;
      in.v = v;
      in.q_norm = on_backend(b, q_norm_);
      in.k_norm = on_backend(b, k_norm_);
      in.index_k = ik;
      in.index_k_norm = on_backend(b, index_k_norm_);
      in.index_q = iq;
      in.index_q_norm = on_backend(b, index_q_norm_);
      in.index_heads = g.index_heads;
      in.eps = kEps;
      in.rope_dims = g.rotary_dim;
      in.index_rope_dims = std::min(g.rotary_dim, g.index_dim);
      return {[=, pool = pool] { be->attention_input(cache, in); },
              [=] {
                return Outputs{{read_act(*be, q)}, {read_act(*be, k)}, {read_act(*be, ik)}, read_pool(),
                               {read_act(*be, iq)}};
              }};
    }
    case AttentionOp::kInsert: {
      const Tensor k = act_on_backend(b, k_, t, kv_cols), v = act_on_backend(b, v_, t, kv_cols);
      const Tensor ik = act_on_backend(b, index_k_, t, g.index_dim);
      return {[=, pool = pool] { be->kv_insert(cache, k, v, ik); }, [=] { return Outputs{read_pool()}; }};
    }
    case AttentionOp::kIndexer: {
      const IndexerParams params = indexer();
      const Tensor iq = act_on_backend(b, index_q_, t, int64_t(g.index_heads) * g.index_dim);
      Tensor sel = b.alloc({t * g.index_heads * g.topk}, DType::kI32);
      poison(sel, 0x7f);
      return {[=, pool = pool] { be->indexer_topk(cache, iq, params, sel); }, [=] { return Outputs{Output(read_bytes(sel))}; }};
    }
    case AttentionOp::kSparse:
    case AttentionOp::kDense: {
      const Tensor q = act_on_backend(b, q_, t, q_cols);
      const Tensor sel = op_ == AttentionOp::kSparse ? on_backend(b, selection_) : Tensor();
      Tensor out = b.alloc({t, q_cols}, b.activation_storage_dtype());
      poison(out, 0xff);
      const float sm_scale = 1.0f / std::sqrt(float(g.head_dim));
      return {[=, pool = pool] { be->paged_attention(cache, q, g.heads, sel, g.topk, sm_scale, out); },
              [=] { return Outputs{{read_act(*be, out)}}; }};
    }
  }
  return {};
}

double AttentionCase::bytes() const {
  const Geometry& g = s_.geometry;
  const StepBatch& b = step_.batch;
  const double kv_row = 2.0 * g.head_dim * element_bytes(s_.kv_dtype);  // K and V of one head, one token
  const double act = 2.0 * tokens() * g.heads * g.head_dim;             // q or out in bf16
  switch (op_) {
    case AttentionOp::kInput:
      return 2 * act + 2.0 * 3 * tokens() * g.kv_heads * g.head_dim + tokens() * (kv_row * g.kv_heads);
    case AttentionOp::kInsert: return 2.0 * 2 * tokens() * g.kv_heads * g.head_dim + tokens() * kv_row * g.kv_heads;
    case AttentionOp::kIndexer: {
      double keys = 0;  // every visible index key once per sequence
      for (int s = 0; s < b.num_seqs(); ++s) keys += b.seq_lens[s];
      return keys * g.index_dim * element_bytes(s_.index_dtype) + 2.0 * tokens() * g.index_heads * g.index_dim;
    }
    case AttentionOp::kDense: {
      double keys = 0;
      for (int s = 0; s < b.num_seqs(); ++s) keys += b.seq_lens[s];
      return keys * kv_row * g.kv_heads + 2 * act;
    }
    case AttentionOp::kSparse: {
      // The union of the selected blocks of each (sequence, KV head), read once.
      double blocks = 0;
      const int32_t* sel = selection_.data_as<const int32_t>();
      for (int s = 0; s < b.num_seqs(); ++s)
        for (int h = 0; h < g.kv_heads; ++h) {
          std::set<int32_t> used;
          for (int tok = b.query_start[s]; tok < b.query_start[s + 1]; ++tok)
            for (int i = 0; i < g.topk; ++i) {
              const int32_t id = sel[(size_t(tok) * g.kv_heads + h) * g.topk + i];
              if (id >= 0) used.insert(id);
            }
          blocks += double(used.size());
        }
      return blocks * g.block_size * kv_row + 2 * act;
    }
  }
  return 0;
}

double AttentionCase::flops() const {
  if (op_ != AttentionOp::kDense && op_ != AttentionOp::kSparse) return 0;
  const Geometry& g = s_.geometry;
  const StepBatch& b = step_.batch;
  double keys = 0;  // (query token, key) pairs of each query head: causal, or the selected blocks
  for (int tok = 0; tok < tokens(); ++tok) {
    if (op_ == AttentionOp::kDense) {
      keys += b.positions[tok] + 1;
    } else {
      const int32_t* sel = selection_.data_as<const int32_t>() + size_t(tok) * g.kv_heads * g.topk;
      int n = 0;
      for (int i = 0; i < g.topk; ++i) n += sel[i] >= 0;
      keys += double(n) * g.block_size;
    }
  }
  return 4.0 * keys * g.heads * g.head_dim;  // QK^T and PV
}

}  // namespace m3::test
