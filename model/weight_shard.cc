// shard_weights: a rank's slices as views where the memory allows and copies where it must.
#include "model/weight_shard.h"

#include <algorithm>
#include <string_view>

#include "core/error.h"

namespace m3 {

namespace {

// The rows or columns of a tensor that one dimension of the layout maps to.
struct Cut {
  std::string_view dimension;  // the config's name for the tensor's extent, for errors
  int64_t full;                // that extent per the config
  int64_t begin, end;
};

// Slice `s` of `count` units of `unit` rows or columns each (heads of head_dim rows, ...).
Cut cut(std::string_view dimension, Slice s, int64_t count, int64_t unit) {
  return {dimension, count * unit, s.begin * unit, s.end() * unit};
}

void check_cut(const LinearWeight& w, const Cut& c, int64_t extent, std::string_view axis) {
  M3_CHECK(extent == c.full, "{}: {} {} where the config's {} make {}", w.name, extent, axis, c.dimension, c.full);
  M3_CHECK(0 <= c.begin && c.begin <= c.end && c.end <= c.full,
           "{}: the rank's {} [{}, {}) of {} run past its {} {}", w.name, axis, c.begin, c.end, c.dimension, extent,
           axis);
}

// A whole extent is the tensor itself (a one-rank layout copies nothing); otherwise the slice,
// its errors (which name the tensor, the bound and the block) told which dimension was cut.
LinearWeight rows_of(const LinearWeight& w, const Cut& c) {
  check_cut(w, c, w.out_features, "output rows");
  if (c.begin == 0 && c.end == c.full) return w;
  try {
    return w.rows(c.begin, c.end);
  } catch (const Error& e) {
    fail("{}, for the rank's rows [{}, {}) of {}", e.what(), c.begin, c.end, c.dimension);
  }
}

LinearWeight columns_of(const LinearWeight& w, const Cut& c) {
  check_cut(w, c, w.in_features, "input columns");
  if (c.begin == 0 && c.end == c.full) return w;
  try {
    return w.columns(c.begin, c.end);
  } catch (const Error& e) {
    fail("{}, for the rank's columns [{}, {}) of {}", e.what(), c.begin, c.end, c.dimension);
  }
}

// Rows `vocab` of the padded vocabulary of a [vocab_size, hidden] table: a view of the real rows,
// grown with zero rows where the slice runs past vocab_size (a rank may hold padding only).
LinearWeight vocab_rows(const LinearWeight& w, Slice vocab, int64_t vocab_size) {
  M3_CHECK(vocab.begin >= 0 && vocab.size >= 0, "{}: the rank's vocabulary rows [{}, {}) are not a range", w.name,
           vocab.begin, vocab.end());
  const int64_t begin = std::min(vocab.begin, vocab_size), end = std::min(vocab.end(), vocab_size);
  return rows_of(w, {"vocab_size", vocab_size, begin, end}).padded_rows(vocab.size);
}

AttentionWeights shard_attention(const AttentionWeights& a, const ModelConfig& c, const RankShard& s, bool sparse) {
  AttentionWeights r = a;  // the norms and index_k whole
  const Cut q = cut("num_attention_heads x head_dim", s.q_heads, c.num_heads, c.head_dim);
  const Cut kv = cut("num_key_value_heads x head_dim", s.kv_heads, c.num_kv_heads, c.head_dim);
  r.q = rows_of(a.q, q);
  r.k = rows_of(a.k, kv);
  r.v = rows_of(a.v, kv);
  r.o = columns_of(a.o, q);
  if (sparse) {
    const Cut index = cut("index_n_heads x index_head_dim", s.index_heads, c.index_heads, c.index_head_dim);
    r.index_q = rows_of(a.index_q, index);
  }
  return r;
}

// gate/up by rows, down by columns of one intermediate slice: each rank's SwiGLU is complete on
// its own columns of the intermediate, and down's partial sums add up across ranks.
template <class Swiglu>  // MlpWeights (dense MLP, shared expert) or ExpertWeights
void cut_swiglu(const Swiglu& full, const Cut& intermediate, Swiglu& out) {
  out.gate = rows_of(full.gate, intermediate);
  out.up = rows_of(full.up, intermediate);
  out.down = columns_of(full.down, intermediate);
}

MlpWeights shard_mlp(const MlpWeights& m, const ModelConfig& c, const RankShard& s, int layer) {
  MlpWeights r;
  if (c.mlp_kinds[layer] == MlpKind::kDense) {
    cut_swiglu(m, cut("dense_intermediate_size", s.dense_intermediate, c.dense_intermediate_size, 1), r);
    return r;
  }
  cut_swiglu(m, cut("shared_intermediate_size", s.shared_intermediate, c.shared_intermediate_size, 1), r);
  r.router = m.router;
  r.router_bias = m.router_bias;
  M3_CHECK(static_cast<int64_t>(m.experts.size()) == c.num_experts,
           "layer {}: {} routed experts where num_local_experts is {}", layer, m.experts.size(), c.num_experts);
  M3_CHECK(s.experts.begin >= 0 && s.experts.size >= 0 && s.experts.end() <= c.num_experts,
           "layer {}: the rank's experts [{}, {}) run past num_local_experts {}", layer, s.experts.begin,
           s.experts.end(), c.num_experts);
  // With expert parallel the slice is the whole width, so the held experts stay views.
  const Cut width = cut("intermediate_size (one routed expert)", s.expert_intermediate, c.moe_intermediate_size, 1);
  r.experts.reserve(s.experts.size);
  for (int64_t e = s.experts.begin; e < s.experts.end(); ++e) cut_swiglu(m.experts[e], width, r.experts.emplace_back());
  return r;
}

}  // namespace

ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& c, const RankShard& s) {
  M3_CHECK(static_cast<int64_t>(full.layers.size()) == c.num_layers,
           "shard_weights: the weights have {} layers where num_hidden_layers is {}", full.layers.size(), c.num_layers);
  M3_CHECK(full.embed.ndim() == 2, "embed_tokens: shape {} is not [vocab_size, hidden_size]",
           shape_string(full.embed.shape()));
  ModelWeights r;
  r.keep_alive = full.keep_alive;
  r.final_norm = full.final_norm;

  LinearWeight table;
  table.name = "embed_tokens";
  table.out_features = full.embed.dim(0);
  table.in_features = full.embed.dim(1);
  table.weight = full.embed;
  r.embed = vocab_rows(table, s.vocab, c.vocab_size).weight;
  // A tied head is the embedding's buffer (load_weights and the dummy weights share it): keep it
  // shared rather than cut or pad the same rows twice.
  if (full.lm_head.weight.data() == full.embed.data() && full.lm_head.format == WeightFormat::kDense) {
    r.lm_head = full.lm_head;
    r.lm_head.out_features = s.vocab.size;
    r.lm_head.weight = r.embed;
  } else {
    r.lm_head = vocab_rows(full.lm_head, s.vocab, c.vocab_size);
  }

  r.layers.resize(full.layers.size());
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = full.layers[i];
    LayerWeights& out = r.layers[i];
    out.input_norm = l.input_norm;
    out.post_attn_norm = l.post_attn_norm;
    out.attn = shard_attention(l.attn, c, s, c.attention_kinds[i] == AttentionKind::kSparse);
    out.mlp = shard_mlp(l.mlp, c, s, i);
  }
  return r;
}

}  // namespace m3
