// The MiniMax-M3 layer graph (docs/reference.md 2), top to bottom, against ops/backend.h.
#include "model/minimax_m3.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "model/weight_footprint.h"

namespace m3 {

KvDType resolve_kv_dtype(const std::string& name, DType activation_dtype) {
  if (name == "auto" || name.empty())
    return activation_dtype == DType::kF32 ? KvDType::kF32 : KvDType::kBF16;
  return parse_kv_dtype(name);
}

DType parse_activation_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32" || name == "f32") return DType::kF32;
  if (name == "bfloat16" || name == "bf16" || name == "auto") return DType::kBF16;
  fail("unsupported --dtype '{}' (expected auto, bfloat16 or float32)", name);
}

KvLayout kv_layout_for(const ModelConfig& c, KvDType kv_dtype, KvDType index_dtype) {
  return kv_layout_for(c, kv_dtype, index_dtype, c.num_kv_heads);
}

KvLayout kv_layout_for(const ModelConfig& c, KvDType kv_dtype, KvDType index_dtype, int kv_heads) {
  std::vector<bool> has_index;
  for (AttentionKind kind : c.attention_kinds) has_index.push_back(kind == AttentionKind::kSparse);
  return KvLayout::make(c.index_block_size, kv_heads, c.head_dim,
                        c.has_sparse_layers() ? c.index_head_dim : 0, kv_dtype, index_dtype, std::move(has_index));
}

ModelPartition whole_model(const ModelConfig& config) {
  const ParallelLayout layout = make_parallel_layout(ParallelConfig{}, model_geometry(config));
  return ModelPartition{layout.ranks.front(), layout.padded_vocab_size, nullptr};
}

BackendConfig backend_config(const ModelConfig& c, DType activation_dtype, const RankShard& shard) {
  BackendConfig b = backend_config(c, activation_dtype);
  b.num_q_heads = static_cast<int>(shard.q_heads.size);
  b.num_kv_heads = static_cast<int>(shard.kv_heads.size);
  b.indexer.index_heads = c.has_sparse_layers() ? static_cast<int>(shard.index_heads.size) : c.index_heads;
  return b;
}

BackendConfig backend_config(const ModelConfig& c, DType activation_dtype) {
  // longrope switches inv_freq with the sequence length; backends plan one table per step.
  M3_CHECK(c.rope.inv_freq_long.empty(), "rope type '{}' (length-dependent frequencies) is not supported",
           c.rope.type);
  BackendConfig b;
  b.activation_dtype = activation_dtype;
  b.num_q_heads = c.num_heads;
  b.num_kv_heads = c.num_kv_heads;
  b.head_dim = c.head_dim;
  b.block_size = c.index_block_size;
  b.has_sparse_layers = c.has_sparse_layers();
  b.index_dim = b.has_sparse_layers ? c.index_head_dim : 0;
  b.indexer.index_heads = c.index_heads;
  b.indexer.topk_blocks = c.index_topk_blocks;
  b.indexer.local_blocks = c.index_local_blocks;
  b.indexer.init_blocks = c.index_init_blocks;
  b.rotary_dim = c.rope.rotary_dim;
  b.rope_inv_freq = c.rope.inv_freq;
  b.rope_attention_factor = static_cast<float>(c.rope.attention_factor);
  return b;
}

namespace {

void check_config(const ModelConfig& c) {
  M3_CHECK(c.num_layers > 0 && c.hidden_size > 0 && c.vocab_size > 0, "config: empty model");
  M3_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
           "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           c.num_heads, c.num_kv_heads);
  M3_CHECK(static_cast<int>(c.attention_kinds.size()) == c.num_layers &&
               static_cast<int>(c.mlp_kinds.size()) == c.num_layers,
           "config: layer_types / mlp_layer_types must have num_hidden_layers ({}) entries",
           c.num_layers);
  if (c.has_sparse_layers()) {
    // Decision 2: index head g selects blocks for the query heads of KV head g.
    M3_CHECK(c.index_heads == c.num_kv_heads,
             "config: index_n_heads ({}) must equal num_key_value_heads ({})", c.index_heads,
             c.num_kv_heads);
    M3_CHECK(c.index_head_dim > 0 && c.index_topk_blocks > 0, "config: bad indexer geometry");
  }
}

}  // namespace

MiniMaxM3::MiniMaxM3(ModelConfig config, ModelWeights weights, Backend& backend, ModelRuntimeOptions options)
    : MiniMaxM3(config, std::move(weights), backend, options, whole_model(config)) {}

MiniMaxM3::MiniMaxM3(ModelConfig config, ModelWeights weights, Backend& backend, ModelRuntimeOptions options,
                     ModelPartition partition)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      backend_(backend),
      options_(options),
      partition_(std::move(partition)) {
  check_config(config_);
  M3_CHECK(static_cast<int>(weights_.layers.size()) == config_.num_layers,
           "weights have {} layers, config {}", weights_.layers.size(), config_.num_layers);
  M3_CHECK(options_.num_kv_blocks > 0, "the KV pool needs at least one block");
  const RankShard& shard = partition_.shard;
  q_heads_ = static_cast<int>(shard.q_heads.size);
  kv_heads_ = static_cast<int>(shard.kv_heads.size);
  index_heads_ = config_.has_sparse_layers() ? static_cast<int>(shard.index_heads.size) : 0;
  const int tp_size = partition_.tp ? partition_.tp->size() : 1;
  M3_CHECK(q_heads_ > 0 && kv_heads_ > 0 && q_heads_ % kv_heads_ == 0,
           "rank {}: {} query heads over {} KV heads is not a partition of the model", shard.rank, q_heads_, kv_heads_);
  M3_CHECK(partition_.padded_vocab_size >= config_.vocab_size && shard.vocab.size * tp_size == partition_.padded_vocab_size,
           "rank {}: vocabulary slice of {} rows x {} ranks does not cover the padded vocabulary {}", shard.rank,
           shard.vocab.size, tp_size, partition_.padded_vocab_size);
  M3_CHECK(weights_.embed.dim(0) == shard.vocab.size,
           "rank {}: the embedding holds {} rows, its vocabulary slice {} (cut the weights with shard_weights)",
           shard.rank, weights_.embed.dim(0), shard.vocab.size);
  M3_CHECK(!partition_.ep || (partition_.ep_host && partition_.ep_host->size() == partition_.ep->size()),
           "rank {}: data-parallel attention needs a host-memory group of its expert-exchange ranks ({} ranks), got {}",
           shard.rank, partition_.ep ? partition_.ep->size() : 0, partition_.ep_host ? partition_.ep_host->size() : 0);
  M3_CHECK(!partition_.indexer_decode_cp || (tp_size > 1 && config_.has_sparse_layers()),
           "indexer decode context parallelism splits the index cache of sparse layers over the -tp ranks; this "
           "model has {} sparse layers and {} rank(s)",
           config_.num_sparse_layers(), tp_size);
  backend_.configure(backend_config(config_, options_.activation_dtype, shard));
  layout_ = kv_layout_for(config_, options_.kv_dtype, options_.index_dtype, kv_heads_);
  kv_pool_ = backend_.alloc({layout_.block_bytes * options_.num_kv_blocks}, DType::kU8);
  M3_CHECK(options_.num_host_kv_blocks >= 0, "the KV host tier needs >= 0 blocks, got {}", options_.num_host_kv_blocks);
  if (options_.num_host_kv_blocks > 0)
    kv_host_tier_ = backend_.alloc_kv_host_tier(layout_.block_bytes * options_.num_host_kv_blocks,
                                                "the KV host tier (--kv-offloading-size)");
}

void MiniMaxM3::copy_kv_blocks(const KvBlockCopies& copies) {
  if (copies.empty()) return;
  M3_CHECK(kv_host_tier_.defined(), "rank {}: KV block copies asked for, but this model has no host tier",
           partition_.shard.rank);
  backend_.copy_kv_blocks(kv_pool_, kv_host_tier_, layout_.block_bytes, copies);
}

void MiniMaxM3::validate(const StepBatch& b) const {
  const int t_count = b.num_tokens(), s_count = b.num_seqs();
  M3_CHECK(t_count > 0, "step batch has no tokens");
  M3_CHECK(static_cast<int>(b.positions.size()) == t_count &&
               static_cast<int>(b.token_seq.size()) == t_count &&
               static_cast<int>(b.slot_mapping.size()) == t_count,
           "step batch: positions/token_seq/slot_mapping must have {} entries", t_count);
  M3_CHECK(static_cast<int>(b.query_start.size()) == s_count + 1 &&
               static_cast<int64_t>(b.page_table.size()) >= int64_t(s_count) * b.pages_per_seq,
           "step batch: query_start needs {} entries and page_table {} x {}", s_count + 1,
           s_count, b.pages_per_seq);
  const int bs = block_size();
  for (int s = 0; s < s_count; ++s) {
    const int pages = (b.seq_lens[s] + bs - 1) / bs;
    M3_CHECK(pages <= b.pages_per_seq, "sequence {}: {} tokens need {} pages, page table has {}",
             s, b.seq_lens[s], pages, b.pages_per_seq);
    for (int p = 0; p < pages; ++p) {
      const int32_t block = b.page_table[int64_t(s) * b.pages_per_seq + p];
      M3_CHECK(block >= 0 && block < options_.num_kv_blocks,
               "sequence {}: page {} maps to block {} outside the pool [0, {})", s, p, block,
               options_.num_kv_blocks);
    }
  }
  for (int t = 0; t < t_count; ++t) {
    const int s = b.token_seq[t];
    M3_CHECK(s >= 0 && s < s_count, "token {}: sequence {} out of range", t, s);
    M3_CHECK(b.positions[t] >= 0 && b.positions[t] < b.seq_lens[s],
             "token {}: position {} outside sequence {} of length {}", t, b.positions[t], s,
             b.seq_lens[s]);
    M3_CHECK(b.token_ids[t] >= 0 && b.token_ids[t] < config_.vocab_size,
             "token {}: id {} outside the vocabulary [0, {})", t, b.token_ids[t], config_.vocab_size);
    const int32_t expected = b.page_table[int64_t(s) * b.pages_per_seq + b.positions[t] / bs] * bs +
                             b.positions[t] % bs;
    M3_CHECK(b.slot_mapping[t] == expected,
             "token {}: slot {} disagrees with its page table (position {} -> slot {})", t,
             b.slot_mapping[t], b.positions[t], expected);
  }
  for (int32_t r : b.logits_rows)
    M3_CHECK(r >= 0 && r < t_count, "logits row {} outside the step's {} tokens", r, t_count);
}

void MiniMaxM3::ensure_activations(int64_t tokens, int64_t logit_rows) {
  const DType dt = backend_.activation_storage_dtype();
  const ModelConfig& c = config_;
  if (act_.capacity_tokens < tokens) {
    const int64_t n = std::max<int64_t>(tokens, 16);
    const int64_t index_cols = c.has_sparse_layers() ? int64_t(index_heads_) * c.index_head_dim : 1;
    const int64_t index_k_cols = c.has_sparse_layers() ? c.index_head_dim : 1;
    act_.x = backend_.alloc({n, c.hidden_size}, dt);
    act_.h = backend_.alloc({n, c.hidden_size}, dt);
    act_.q = backend_.alloc({n, int64_t(q_heads_) * c.head_dim}, dt);
    act_.k = backend_.alloc({n, int64_t(kv_heads_) * c.head_dim}, dt);
    act_.v = backend_.alloc({n, int64_t(kv_heads_) * c.head_dim}, dt);
    act_.index_q = backend_.alloc({n, index_cols}, dt);
    act_.index_k = backend_.alloc({n, index_k_cols}, dt);
    act_.attn = backend_.alloc({n, int64_t(q_heads_) * c.head_dim}, dt);
    act_.selection = backend_.alloc({n * std::max(1, index_heads_) * c.index_topk_blocks}, DType::kI32);
    act_.mlp = backend_.alloc({n, c.hidden_size}, dt);
    if (partition_.indexer_decode_cp) {
      const int64_t ranks = partition_.tp->size(), per_rank = n * index_heads_ * c.index_topk_blocks;
      act_.index_q_parts = backend_.alloc({ranks * n, index_cols}, dt);
      act_.candidates = backend_.alloc({ranks * per_rank}, DType::kI64);
      act_.gathered_candidates = backend_.alloc({ranks * ranks * per_rank}, DType::kI64);
    }
    act_.capacity_tokens = n;
    ++act_.generation;
  }
  if (!act_.logit_rows.defined() || act_.logit_rows.dim(0) < logit_rows) {
    const int64_t n = std::max<int64_t>(logit_rows, 16);
    act_.logit_rows = backend_.alloc({n, c.hidden_size}, dt);
    logits_ = backend_.alloc({n, c.vocab_size}, dt);
    if (partition_.tp && partition_.tp->size() > 1) {
      rank_logits_ = backend_.alloc({n, partition_.shard.vocab.size}, dt);
      gathered_logits_ = backend_.alloc({n * partition_.tp->size(), partition_.shard.vocab.size}, dt);
    }
    ++act_.generation;
  }
}

// Attention: projections, q/k norm + partial RoPE, KV (and index-K) write, block selection on
// sparse layers, paged attention over the visible (or selected) blocks, o_proj.
void MiniMaxM3::attention_block(int layer, Activations& a) {
  const ModelConfig& c = config_;
  const AttentionWeights& w = weights_.layers[layer].attn;
  const int64_t t = backend_.planned_step().num_tokens;
  const KvLayerView cache = layout_.layer_view(kv_pool_.data_as<uint8_t>(), layer);
  Tensor h = a.h.rows(0, t), q = a.q.rows(0, t), k = a.k.rows(0, t), v = a.v.rows(0, t);

  const bool sparse = c.attention_kinds[layer] == AttentionKind::kSparse;
  Tensor iq, ik;
  if (sparse) {
    iq = a.index_q.rows(0, t);
    ik = a.index_k.rows(0, t);
  }
  // One op for all projections of h (one launch at decode on the GPU).
  const LinearOutput projections[] = {{&w.q, q}, {&w.k, k}, {&w.v, v}, {&w.index_q, iq}, {&w.index_k, ik}};
  backend_.linears(h, std::span(projections, sparse ? 5 : 3));
  // The indexer reuses the main cos/sin truncated to index_head_dim channels.
  const int index_rope = sparse ? std::min(c.rope.rotary_dim, c.index_head_dim) : 0;
  // q/k (and index-K, index-q) norms + RoPE and the cache write in one op (one kernel on the GPU).
  AttentionInputs in;
  in.q = q;
  in.num_q_heads = q_heads_;
  in.k = k;
  in.v = v;
  in.q_norm = w.q_norm;
  in.k_norm = w.k_norm;
  if (sparse) {
    in.index_k = ik;
    in.index_k_norm = w.index_k_norm;
    in.index_q = iq;
    in.index_q_norm = w.index_q_norm;
    in.index_heads = index_heads_;
  }
  in.eps = c.rms_norm_eps;
  in.rope_dims = c.rope.rotary_dim;
  in.index_rope_dims = index_rope;
  backend_.attention_input(cache, in);

  Tensor selection;
  if (sparse) {
    IndexerParams params;
    params.index_heads = index_heads_;
    params.topk_blocks = c.index_topk_blocks;
    params.local_blocks = c.index_local_blocks;
    params.init_blocks = c.index_init_blocks;
    selection = a.selection.rows(0, t * index_heads_ * c.index_topk_blocks);
    if (partition_.indexer_decode_cp) {
      // Every rank scores its own blocks (b % ranks == rank) for every rank's heads; the merge
      // keeps this rank's heads. Two all-gathers, no other exchange.
      Communicator& tp = *partition_.tp;
      const int ranks = tp.size();
      const int64_t per_rank = t * index_heads_ * c.index_topk_blocks;
      Tensor parts = a.index_q_parts.rows(0, ranks * t);
      tp.all_gather(iq, parts);
      Tensor candidates = a.candidates.rows(0, ranks * per_rank);
      backend_.indexer_topk_candidates(cache, parts, ranks, params, ranks, tp.rank(), candidates);
      Tensor gathered = a.gathered_candidates.rows(0, int64_t(ranks) * ranks * per_rank);
      tp.all_gather(candidates, gathered);
      backend_.merge_topk_candidates(gathered, ranks, ranks, tp.rank(), params, selection);
    } else {
      backend_.indexer_topk(cache, iq, params, selection);
    }
  }

  Tensor attn = a.attn.rows(0, t);
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  backend_.paged_attention(cache, q, q_heads_, selection, c.index_topk_blocks, sm_scale, attn);
  backend_.linear(attn, w.o, h);  // h is free again: reuse it for the attention output
  reduce_tp(h);
}

int64_t MiniMaxM3::dep_step_tokens(int64_t t) {
  Tensor count = Tensor::zeros({1}, DType::kI32);  // host memory, over the host group
  count.data_as<int32_t>()[0] = static_cast<int32_t>(t);
  partition_.ep_host->all_reduce(count, ReduceOp::kMax);
  return count.data_as<int32_t>()[0];
}

void MiniMaxM3::ensure_dep_buffers(int64_t max_tokens) {
  const int64_t ranks = partition_.ep->size();
  if (act_.dep_mine.defined() && act_.dep_mine.dim(0) >= max_tokens) return;
  const int64_t n = std::max<int64_t>(max_tokens, 16);
  const DType dt = backend_.activation_storage_dtype();
  act_.dep_gathered = backend_.alloc({ranks * n, config_.hidden_size}, dt);
  act_.dep_routed = backend_.alloc({ranks * n, config_.hidden_size}, dt);
  act_.dep_mine = backend_.alloc({n, config_.hidden_size}, dt);
  ++act_.generation;
}

MoeParams MiniMaxM3::moe_params() const {
  const ModelConfig& c = config_;
  MoeParams p;
  p.num_experts = c.num_experts;
  p.experts_per_token = c.experts_per_token;
  p.routed_scaling_factor = c.routed_scaling_factor;
  p.swiglu_alpha = c.swiglu_alpha;
  p.swiglu_limit = c.swiglu_limit;
  p.first_expert = static_cast<int>(partition_.shard.experts.begin);
  return p;
}

// Every rank sends max-tokens rows of h (its copy's tokens first; the rows past them are whatever
// the buffer holds: the MoE is row-independent, so they cost work and are dropped), runs its
// experts over every copy's rows, and gets back the sum over the `ep` group of its copy's rows.
void MiniMaxM3::dep_routed_experts(int layer, Tensor routed_out) {
  Communicator& ep = *partition_.ep;
  const int64_t m = dep_max_tokens_, ranks = ep.size();
  Tensor gathered = act_.dep_gathered.rows(0, ranks * m), routed = act_.dep_routed.rows(0, ranks * m);
  ep.all_gather(act_.h.rows(0, m), gathered);
  MoeParams p = moe_params();
  p.add_shared = false;
  backend_.moe(gathered, weights_.layers[layer].mlp, p, routed);
  ep.reduce_scatter(routed, routed_out.rows(0, m));
}

void MiniMaxM3::idle_step() {
  M3_CHECK(partition_.ep, "idle_step: only data-parallel attention ranks take part in their peers' steps");
  dep_max_tokens_ = dep_step_tokens(0);
  if (dep_max_tokens_ == 0) return;  // nobody had tokens (every rank called idle_step)
  ensure_activations(dep_max_tokens_, 0);
  ensure_dep_buffers(dep_max_tokens_);
  // The rows that come back are the padding this copy sent: nothing reads them, so the copy's
  // all-reduce that would add them up (-tp > 1) is left out too, by every rank of the copy alike.
  for (int l = 0; l < config_.num_layers; ++l)
    if (config_.mlp_kinds[l] == MlpKind::kMoe) dep_routed_experts(l, act_.dep_mine);
}

void MiniMaxM3::reduce_tp(Tensor x) {
  if (partition_.tp && partition_.tp->size() > 1) partition_.tp->all_reduce(x, ReduceOp::kSum);
}

// MLP: dense SwiGLU-OAI, or the MoE block (sigmoid router, top-k experts, shared expert).
void MiniMaxM3::mlp_block(int layer, Activations& a) {
  const ModelConfig& c = config_;
  const MlpWeights& w = weights_.layers[layer].mlp;
  const int64_t t = backend_.planned_step().num_tokens;
  Tensor h = a.h.rows(0, t), out = a.mlp.rows(0, t);
  if (c.mlp_kinds[layer] == MlpKind::kDense) {
    backend_.swiglu_mlp(h, w.gate, w.up, w.down, c.swiglu_alpha, c.swiglu_limit, out);
    reduce_tp(out);
    return;
  }
  if (partition_.ep) {
    // This copy's tokens: the shared expert here (this rank's slice of its width with -tp > 1),
    // the routed experts over every copy. Rank (copy d, tp rank j) holds experts E(d, j); after
    // the attention's all-reduce every rank of a copy holds the same rows, so the group of tp
    // rank j (one rank per copy) sees every copy's rows, and its reduce-scatter leaves rank
    // (d, j) with sum over copies d' of E(d', j) on copy d's rows. The copy's all-reduce below
    // then sums over j: all experts, plus the shared expert's slices (added once each, as in
    // -tp). One all-reduce, the one -tp has after its MoE anyway; with -tp 1 it is nothing.
    backend_.swiglu_mlp(h, w.gate, w.up, w.down, c.swiglu_alpha, c.swiglu_limit, out);
    dep_routed_experts(layer, a.dep_mine);
    backend_.add_inplace(out, a.dep_mine.rows(0, t));
    reduce_tp(out);
    return;
  }
  backend_.moe(h, w, moe_params(), out);
  // Each rank's output holds its part of the shared expert and of the routed experts it holds (a
  // slice of every expert's width, or whole experts with expert parallel): their sum is the block.
  reduce_tp(out);
}

namespace {

// A step a backend may replay from a recording (CUDA graphs), since only metadata contents change:
// the same number of tokens for every sequence, at most 8 (a decode, or a speculative verification
// of up to 7 drafts), and a logits row for each token.
bool is_uniform_step(const StepBatch& b) {
  const int s_count = b.num_seqs();
  if (s_count < 1) return false;
  const int q = b.query_start[1] - b.query_start[0];
  if (q < 1 || q > 8 || b.num_tokens() != s_count * q || b.logits_rows.size() != size_t(b.num_tokens())) return false;
  for (int s = 0; s < s_count; ++s)
    if (b.query_start[s + 1] - b.query_start[s] != q) return false;
  return true;
}

}  // namespace

void MiniMaxM3::forward(const StepBatch& batch, float* logits) {
  validate(batch);
  const int64_t t = batch.num_tokens();
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  ensure_activations(t, rows);
  if (partition_.ep) {
    dep_max_tokens_ = dep_step_tokens(t);
    ensure_activations(dep_max_tokens_, rows);
    ensure_dep_buffers(dep_max_tokens_);
  }
  backend_.plan(batch);
  const int64_t taps_generation = taps_ ? taps_->reserve_taps(t) : 0;
  // Data-parallel steps exchange a per-step number of rows, which a recording would freeze.
  if (is_uniform_step(batch) && !partition_.ep) {
    const ReplayKey key{this, static_cast<int>(t), batch.num_seqs(), static_cast<int>(rows), act_.generation,
                        taps_generation};
    backend_.run_replayable(key, [&] { run_layers(t, rows); });
  } else {
    run_layers(t, rows);
  }
  if (rows > 0 && logits) backend_.copy_to_host_f32(logits_.rows(0, rows), logits);
}

void MiniMaxM3::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                               RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) {
  forward(batch, nullptr);
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  const int64_t vocab = config_.vocab_size;
  // Runs of consecutive rows go in one copy (prompt-logprob rows of a sequence are consecutive).
  for (size_t i = 0; i < host_rows.size();) {
    size_t j = i + 1;
    while (j < host_rows.size() && host_rows[j] == host_rows[j - 1] + 1) ++j;
    M3_CHECK(host_rows[i] >= 0 && host_rows[j - 1] < rows, "host logits rows {}..{} outside the step's {} rows",
             host_rows[i], host_rows[j - 1], rows);
    backend_.copy_to_host_f32(logits_.rows(host_rows[i], host_rows[j - 1] + 1), host_logits + int64_t(i) * vocab);
    i = j;
  }
  if (sampling.rows.empty() && sampling.logprobs.empty()) return;
  for (const SampleRow& r : sampling.rows)
    M3_CHECK(r.logits_row >= 0 && r.logits_row < rows, "sampling row reads logits row {} of the step's {}",
             r.logits_row, rows);
  backend_.sample(logits_.rows(0, rows), sampling, sampled_ids, logprobs);
}

void MiniMaxM3::run_layers(int64_t t, int64_t rows) {
  Activations& a = act_;
  Tensor x = a.x.rows(0, t), h = a.h.rows(0, t), mlp = a.mlp.rows(0, t);
  const float eps = config_.rms_norm_eps;
  const int last_layer = config_.num_layers - 1;
  // Every residual add is fused with the norm that reads its result (add_rms_norm): the post-
  // attention norm, the next layer's input norm, and the final norm when every row is wanted.
  backend_.embed(weights_.embed, partition_.shard.vocab.begin, x);
  reduce_tp(x);
  backend_.rms_norm(x, weights_.layers[0].input_norm, eps, h);
  bool last_added = false;  // whether x holds the last layer's output yet
  for (int l = 0; l <= last_layer; ++l) {
    attention_block(l, a);
    backend_.add_rms_norm(x, h, weights_.layers[l].post_attn_norm, eps, h);
    mlp_block(l, a);
    if (l < last_layer) {
      backend_.add_rms_norm(x, mlp, weights_.layers[l + 1].input_norm, eps, h);
      tap(l, x);
    } else if (is_tap_layer(l)) {
      backend_.add_inplace(x, mlp);  // the output of the last layer, which the final norm then reads
      last_added = true;
      tap(l, x);
    }
  }
  if (rows == 0) return;  // the residual stream is not read again
  // Only the requested rows go through the final norm and the head (the norm is per row, so
  // norming all rows and gathering gives the same rows).
  Tensor last = a.logit_rows.rows(0, rows);
  if (last_added) {
    backend_.gather_logits_rows(x, last);
    backend_.rms_norm(last, weights_.final_norm, eps, last);
  } else if (rows == t) {
    backend_.add_rms_norm(x, mlp, weights_.final_norm, eps, h);
    backend_.gather_logits_rows(h, last);
  } else {
    backend_.add_inplace(x, mlp);
    backend_.gather_logits_rows(x, last);
    backend_.rms_norm(last, weights_.final_norm, eps, last);
  }
  if (!rank_logits_.defined()) {
    backend_.linear(last, weights_.lm_head, logits_.rows(0, rows));
    return;
  }
  // Vocab-parallel head: each rank's slice of the columns, gathered, then put side by side.
  Communicator& tp = *partition_.tp;
  Tensor mine = rank_logits_.rows(0, rows);
  backend_.linear(last, weights_.lm_head, mine);
  Tensor all = gathered_logits_.rows(0, rows * tp.size());
  tp.all_gather(mine, all);
  backend_.concat_column_parts(all, tp.size(), logits_.rows(0, rows));
}

void MiniMaxM3::set_taps(LayerTaps* taps) {
  if (taps)
    for (int l : taps->tap_layers())
      M3_CHECK(l >= 0 && l < config_.num_layers, "tap layer {} is not one of the model's {} layers", l,
               config_.num_layers);
  taps_ = taps;
}

bool MiniMaxM3::is_tap_layer(int layer) const {
  if (!taps_) return false;
  const std::vector<int>& layers = taps_->tap_layers();
  return std::find(layers.begin(), layers.end(), layer) != layers.end();
}

void MiniMaxM3::tap(int layer, const Tensor& x) {
  if (!taps_) return;
  const std::vector<int>& layers = taps_->tap_layers();
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] == layer) taps_->tap(static_cast<int>(i), x);
}

}  // namespace m3
