#include "model/dspark.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config_fields.h"
#include "model/weights.h"
#include "ops/draft_heads.h"
#include "ops/token_constraint.h"

namespace m3 {
namespace {

using config_detail::Fields;

int required_int(const Fields& f, const char* key) {
  const std::optional<int64_t> v = f.opt_int(key);
  if (!v) f.reject(key, "required");
  if (*v <= 0 || *v > (int64_t(1) << 30)) f.reject(key, "must be a positive integer");
  return static_cast<int>(*v);
}

}  // namespace

DSparkConfig load_dspark_config(const std::filesystem::path& dir) {
  std::filesystem::path path = dir;
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream in(path);
  if (!in) fail("{}: cannot open (the DSpark drafter's config)", path.string());
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
  if (!json.is_object()) fail("{}: not a JSON object", path.string());
  const Fields f(json, path.string(), "");
  const std::vector<std::string> arch = f.opt_strings("architectures").value_or(std::vector<std::string>{});
  if (std::find(arch.begin(), arch.end(), "DSparkMiniMaxDraftModel") == arch.end())
    f.reject("architectures", "a DSpark drafter of a MiniMax model has DSparkMiniMaxDraftModel");
  DSparkConfig c;
  c.vocab_size = required_int(f, "vocab_size");
  c.hidden_size = required_int(f, "hidden_size");
  c.num_layers = required_int(f, "num_hidden_layers");
  c.num_heads = required_int(f, "num_attention_heads");
  c.num_kv_heads = required_int(f, "num_key_value_heads");
  c.head_dim = required_int(f, "head_dim");
  c.intermediate_size = required_int(f, "intermediate_size");
  if (c.num_heads % c.num_kv_heads != 0) f.reject("num_key_value_heads", "must divide num_attention_heads");
  const double factor = f.get_number("partial_rotary_factor", 1.0);
  c.rotary_dim = static_cast<int>(c.head_dim * factor);
  if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2) f.reject("partial_rotary_factor", "bad rotary width");
  c.rope_theta = f.get_number("rope_theta", 0.0);
  if (!(c.rope_theta > 0.0)) f.reject("rope_theta", "required, positive");
  c.rms_norm_eps = static_cast<float>(f.get_number("rms_norm_eps", 1e-6));
  if (f.get_string("hidden_act", "swigluoai") != "swigluoai") f.reject("hidden_act", "m3serve's DSpark drafter has swigluoai");
  c.swiglu_alpha = static_cast<float>(f.get_number("swiglu_alpha", 1.702));
  c.swiglu_limit = static_cast<float>(f.get_number("swiglu_limit", 7.0));
  c.sliding_window = required_int(f, "sliding_window");
  const std::vector<std::string> types = f.opt_strings("layer_types").value_or(std::vector<std::string>{});
  if (static_cast<int>(types.size()) != c.num_layers ||
      std::any_of(types.begin(), types.end(), [](const std::string& t) { return t != "sliding_attention"; }))
    f.reject("layer_types", "one sliding_attention entry per layer");
  if (const auto moe = f.opt_flags("moe_layer_freq"); moe && std::any_of(moe->begin(), moe->end(), [](bool b) { return b; }))
    f.reject("moe_layer_freq", "the drafter's layers are dense");
  if (f.has("sparse_attention_config")) f.reject("sparse_attention_config", "the drafter's layers have no MSA (null)");
  const nlohmann::json* taps = f.raw("dspark_target_layer_ids");
  if (!taps || !taps->is_array() || taps->empty()) f.reject("dspark_target_layer_ids", "a non-empty list of layer ids");
  for (const nlohmann::json& t : *taps) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0) f.reject("dspark_target_layer_ids", "layer ids are integers >= 0");
    c.target_layer_ids.push_back(t.get<int>());
  }
  c.block_size = required_int(f, "dspark_block_size");
  const std::optional<int64_t> noise = f.opt_int("dspark_noise_token_id");
  if (!noise || *noise < 0 || *noise >= c.vocab_size) f.reject("dspark_noise_token_id", "a token id of the vocabulary");
  c.noise_token_id = static_cast<int32_t>(*noise);
  c.markov_rank = required_int(f, "dspark_markov_rank");
  c.confidence_with_markov = f.get_bool("confidence_head_with_markov", true);
  return c;
}

DSparkDrafter::DSparkDrafter(DSparkConfig config, DSparkWeights weights, MarkovHeadWeights host_heads,
                             Backend& backend, Tensor embed, LinearWeight lm_head, int64_t num_kv_blocks,
                             int kv_block_size, KvDType cache_dtype, int64_t num_host_kv_blocks)
    : config_(std::move(config)),
      w_(std::move(weights)),
      host_heads_(std::move(host_heads)),
      backend_(backend),
      embed_(std::move(embed)),
      lm_head_(std::move(lm_head)) {
  const DSparkConfig& c = config_;
  M3_CHECK(embed_.defined() && embed_.ndim() == 2 && embed_.dim(0) == c.vocab_size && embed_.dim(1) == c.hidden_size &&
               lm_head_.out_features == c.vocab_size && lm_head_.in_features == c.hidden_size,
           "DSpark drafter: the target's embed and lm_head must be [{}, {}] (the whole vocabulary)", c.vocab_size,
           c.hidden_size);
  M3_CHECK(num_kv_blocks > 0 && kv_block_size > 0, "DSpark drafter: {} KV blocks of {}", num_kv_blocks, kv_block_size);
  M3_CHECK(cache_dtype != KvDType::kNVFP4, "DSpark drafter: its cache holds float32, bfloat16 or fp8, not nvfp4");
  M3_CHECK(w_.fc.size() == c.target_layer_ids.size() && static_cast<int>(w_.layers.size()) == c.num_layers,
           "DSpark drafter: weights for {} taps and {} layers, the config has {} and {}", w_.fc.size(),
           w_.layers.size(), c.target_layer_ids.size(), c.num_layers);
  layout_ = dspark_kv_layout(c, kv_block_size, cache_dtype);
  pool_ = backend_.alloc({num_kv_blocks * layout_.block_bytes}, DType::kU8);
  if (num_host_kv_blocks > 0)
    host_tier_ = backend_.alloc_kv_host_tier(num_host_kv_blocks * layout_.block_bytes, "the DSpark drafter's host tier");
}

int64_t DSparkDrafter::reserve_taps(int64_t tokens) {
  taps_seen_ = 0;  // a step that failed part-way leaves no half sum behind
  if (tokens <= tap_rows_) return tap_generation_;
  const DSparkConfig& c = config_;
  const DType act = backend_.activation_storage_dtype();
  const int64_t kv = int64_t(c.num_kv_heads) * c.head_dim;
  tap_rows_ = std::max<int64_t>(tokens, 2 * tap_rows_);
  ctx_ = backend_.alloc({tap_rows_, c.hidden_size}, act);
  ctx_part_ = backend_.alloc({tap_rows_, c.hidden_size}, act);
  ctx_k_ = backend_.alloc({tap_rows_, kv}, act);
  ctx_v_ = backend_.alloc({tap_rows_, kv}, act);
  return ++tap_generation_;
}

void DSparkDrafter::tap(int index, const Tensor& x) {
  const DSparkConfig& c = config_;
  const int64_t t = x.dim(0);
  M3_CHECK(t <= tap_rows_, "DSpark drafter: a tap of {} rows, room for {} (reserve_taps first)", t, tap_rows_);
  Tensor ctx = ctx_.rows(0, t);
  if (taps_seen_ == 0) {
    backend_.linear(x, w_.fc[index], ctx);
  } else {
    Tensor part = ctx_part_.rows(0, t);
    backend_.linear(x, w_.fc[index], part);
    backend_.add_inplace(ctx, part);
  }
  if (++taps_seen_ < static_cast<int>(c.target_layer_ids.size())) return;
  taps_seen_ = 0;
  // Every tap is in: the context rows into each layer's cache at the step's slots.
  backend_.rms_norm(ctx, w_.hidden_norm, c.rms_norm_eps, ctx);
  Tensor k = ctx_k_.rows(0, t), v = ctx_v_.rows(0, t);
  for (int l = 0; l < c.num_layers; ++l) {
    const DSparkLayerWeights& lw = w_.layers[l];
    const LinearOutput kv[] = {{&lw.k, k}, {&lw.v, v}};
    backend_.linears(ctx, kv);
    backend_.head_norm_rope(k, c.num_kv_heads, c.head_dim, lw.k_norm, c.rms_norm_eps, c.rotary_dim);
    backend_.kv_insert(layer_view(l), k, v, Tensor());
  }
}

void DSparkDrafter::copy_blocks(const KvBlockCopies& copies) {
  if (copies.empty()) return;
  M3_CHECK(host_tier_.defined(), "DSpark drafter: block copies to a host tier it was not given");
  backend_.copy_kv_blocks(pool_, host_tier_, layout_.block_bytes, copies);
}

void DSparkDrafter::ensure_step_buffers(int64_t rows) {
  if (rows <= step_rows_) return;
  ++step_generation_;
  const DSparkConfig& c = config_;
  const DType act = backend_.activation_storage_dtype();
  const int64_t h = c.hidden_size, q = int64_t(c.num_heads) * c.head_dim, kv = int64_t(c.num_kv_heads) * c.head_dim;
  step_rows_ = rows;
  x_ = backend_.alloc({rows, h}, act);
  hn_ = backend_.alloc({rows, h}, act);
  q_ = backend_.alloc({rows, q}, act);
  bk_ = backend_.alloc({rows, kv}, act);
  bv_ = backend_.alloc({rows, kv}, act);
  attn_ = backend_.alloc({rows, q}, act);
  o_ = backend_.alloc({rows, h}, act);
  mlp_ = backend_.alloc({rows, h}, act);
  logits_ = backend_.alloc({rows, c.vocab_size}, act);
  head_in_ = backend_.alloc({rows, h}, act);
}

std::vector<DSparkDrafts> DSparkDrafter::propose(std::span<const DSparkBlock> blocks, bool keep_logits) {
  std::vector<DSparkDrafts> out(blocks.size());
  const size_t per_step = std::max<size_t>(1, kMaxRowsPerStep / config_.block_size);
  for (size_t i = 0; i < blocks.size(); i += per_step) {
    const size_t n = std::min(per_step, blocks.size() - i);
    propose_chunk(blocks.subspan(i, n), keep_logits, out.data() + i);
  }
  return out;
}

void DSparkDrafter::propose_chunk(std::span<const DSparkBlock> blocks, bool keep_logits, DSparkDrafts* out) {
  const DSparkConfig& c = config_;
  const int n = c.block_size, bs = layout_.block_size;
  const int64_t h = c.hidden_size, vocab = c.vocab_size;
  const int r_count = static_cast<int>(blocks.size());
  const int64_t rows = int64_t(r_count) * n;
  // The step: block s's queries [anchor, noise...] at anchor_pos .. anchor_pos + n - 1.
  StepBatch& b = step_;
  b = StepBatch();
  int32_t pages = 1;
  for (const DSparkBlock& blk : blocks) {
    M3_CHECK(blk.num_drafts >= 1 && blk.num_drafts <= n, "DSpark drafter: {} drafts from a block of {}",
             blk.num_drafts, n);
    M3_CHECK(blk.anchor >= 0 && blk.anchor < c.vocab_size && blk.anchor_pos >= 1,
             "DSpark drafter: anchor {} at position {}", blk.anchor, blk.anchor_pos);
    const size_t needed = static_cast<size_t>((blk.anchor_pos - 1) / bs + 1);  // the context's blocks
    M3_CHECK(blk.block_table.size() >= needed, "DSpark drafter: a context of {} positions in {} blocks",
             blk.anchor_pos, blk.block_table.size());
    pages = std::max(pages, (blk.anchor_pos + n + bs - 1) / bs);
  }
  // The whole block runs through the layers (its attention is non-causal), but draft j reads only
  // rows [0, j] of the heads: the final norm's rows past the most drafts any block wants are not
  // projected (a block of 7 drafting 3 projects 3 rows through the lm_head and the Markov head).
  int m = 1;
  for (const DSparkBlock& blk : blocks) m = std::max(m, blk.num_drafts);
  if (keep_logits) m = n;
  const int64_t head_rows = int64_t(r_count) * m;
  b.pages_per_seq = pages;
  b.query_start.push_back(0);
  for (int s = 0; s < r_count; ++s) {
    const DSparkBlock& blk = blocks[s];
    for (int j = 0; j < n; ++j) {
      b.token_ids.push_back(j == 0 ? blk.anchor : c.noise_token_id);
      b.positions.push_back(blk.anchor_pos + j);
      b.token_seq.push_back(s);
      b.slot_mapping.push_back(-1);  // the block's K and V stay in activations
      if (j < m) b.logits_rows.push_back(static_cast<int32_t>(b.token_ids.size() - 1));
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.seq_lens.push_back(blk.anchor_pos + n);
    // Pages past the context's are never read (ops/attention.h): they repeat its last block.
    const size_t have = std::min<size_t>(blk.block_table.size(), static_cast<size_t>(pages));
    for (int p = 0; p < pages; ++p)
      b.page_table.push_back(blk.block_table[std::min<size_t>(p, have - 1)]);
  }
  ensure_step_buffers(rows);
  backend_.plan(b);
  Tensor x = x_.rows(0, rows), hn = hn_.rows(0, rows), q = q_.rows(0, rows), bk = bk_.rows(0, rows);
  Tensor bv = bv_.rows(0, rows), attn = attn_.rows(0, rows), o = o_.rows(0, rows), mlp = mlp_.rows(0, rows);
  Tensor logits = logits_.rows(0, head_rows), head_in = m < n ? head_in_.rows(0, head_rows) : hn;
  const float eps = c.rms_norm_eps, scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // Every block has block_size queries and its first m rows for the heads: a step the backend may
  // replay (CUDA graphs) for a given number of blocks and m, up to the heads (markov_drafts waits
  // for the device).
  const ReplayKey key{this, static_cast<int>(rows), r_count, static_cast<int>(head_rows), step_generation_, 0};
  backend_.run_replayable(key, [&] {
    backend_.embed(embed_, 0, x);
    for (int l = 0; l < c.num_layers; ++l) {
      const DSparkLayerWeights& lw = w_.layers[l];
      backend_.rms_norm(x, lw.input_norm, eps, hn);
      const LinearOutput qkv[] = {{&lw.q, q}, {&lw.k, bk}, {&lw.v, bv}};
      backend_.linears(hn, qkv);
      backend_.head_norm_rope(q, c.num_heads, c.head_dim, lw.q_norm, eps, c.rotary_dim);
      backend_.head_norm_rope(bk, c.num_kv_heads, c.head_dim, lw.k_norm, eps, c.rotary_dim);
      backend_.draft_block_attention(layer_view(l), q, c.num_heads, bk, bv, n, c.sliding_window, scale, attn);
      backend_.linear(attn, lw.o, o);
      backend_.add_rms_norm(x, o, lw.post_attn_norm, eps, hn);
      backend_.swiglu_mlp(hn, lw.gate, lw.up, lw.down, c.swiglu_alpha, c.swiglu_limit, mlp);
      backend_.add_inplace(x, mlp);
    }
    backend_.rms_norm(x, w_.final_norm, eps, hn);
    if (m < n) backend_.gather_logits_rows(hn, head_in);
    backend_.linear(head_in, lm_head_, logits);
  });
  std::vector<int32_t> ids(head_rows);
  std::vector<float> confidence(head_rows);
  backend_.markov_drafts(logits, head_in, w_.heads, m, ids.data(), confidence.data());

  // Probabilistic and constrained blocks (and checks) read their rows on the host.
  MarkovHeadView head;
  head.w1 = host_heads_.w1.data_as<const float>();
  head.w2 = host_heads_.w2.data_as<const float>();
  head.vocab = vocab;
  head.rank = c.markov_rank;
  head.confidence_w = host_heads_.confidence_w.data_as<const float>();
  head.confidence_b = host_heads_.confidence_b;
  head.confidence_with_markov = host_heads_.confidence_with_markov;
  head.hidden = h;
  std::vector<float> base, normed, scratch;
  for (int s = 0; s < r_count; ++s) {
    const DSparkBlock& blk = blocks[s];
    DSparkDrafts& d = out[s];
    const int64_t row = int64_t(s) * m;
    const bool sampled = blk.sampling && !sample_row_greedy(*blk.sampling);
    if (sampled || blk.constraint || keep_logits) {
      base.resize(static_cast<size_t>(m) * vocab);
      backend_.copy_to_host_f32(logits.rows(row, row + m), base.data());
      if (keep_logits) d.base_logits = base;
    }
    if (!sampled && !blk.constraint) {
      d.tokens.assign(ids.begin() + row, ids.begin() + row + blk.num_drafts);
      d.confidence.assign(confidence.begin() + row, confidence.begin() + row + blk.num_drafts);
      continue;
    }
    M3_CHECK(!sampled || static_cast<int>(blk.draw_uniforms.size()) >= blk.num_drafts,
             "DSpark drafter: {} draws for {} drafts", blk.draw_uniforms.size(), blk.num_drafts);
    normed.resize(static_cast<size_t>(m) * h);
    backend_.copy_to_host_f32(head_in.rows(row, row + m), normed.data());
    scratch.resize(vocab);
    SampleRow sample_row;  // the drafter's own distribution: no penalties or biases
    if (sampled) {
      sample_row.temperature = blk.sampling->temperature;
      sample_row.top_k = blk.sampling->top_k;
      sample_row.top_p = blk.sampling->top_p;
      sample_row.min_p = blk.sampling->min_p;
    } else {
      sample_row.temperature = 0.0f;
    }
    SampleBatch batch;
    batch.add(sample_row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
    // A constrained block: draft j under the constraint's mask after drafts [0, j), so no draft is
    // one the engine would cut, and a probabilistic draft's distribution is the masked one the
    // target's row is verified against.
    std::optional<DraftConstraintWalk> walk;
    if (blk.constraint) {
      walk.emplace(*blk.constraint, blk.remaining_tokens);
      batch.allowed_words = token_mask_words(static_cast<int32_t>(vocab));
      batch.add_allowed_row(batch.allowed_words);
    }
    const std::span<uint32_t> words(batch.allowed);
    SampleWorkspace ws;
    std::vector<int32_t> drafted(blk.num_drafts);
    std::vector<float> conf(blk.num_drafts);
    if (sampled) d.rows.resize(blk.num_drafts);
    int picked = 0;
    try {
      picked = markov_block(
          head, base.data(), normed.data(), blk.num_drafts, blk.anchor,
          [&](int j, const float* adjusted) -> int32_t {
            if (walk) {
              if (walk->terminated()) return -1;  // the output is complete
              batch.rows[0].allowed_row = walk->next_mask(words) ? 0 : -1;
            }
            int32_t id;
            if (sampled) {
              sample_distribution(adjusted, static_cast<int32_t>(vocab), batch.rows[0], batch, ws, d.rows[j]);
              id = d.rows[j].draw(blk.draw_uniforms[j]);
            } else {  // a greedy row: the best token the mask allows
              id = sample_reference(adjusted, static_cast<int32_t>(vocab), batch.rows[0], batch, ws);
            }
            if (walk && !walk->accept(id)) return -1;  // nothing allowed is left
            return id;
          },
          drafted.data(), conf.data(), scratch.data());
    } catch (const Error&) {
      // The constraint cannot give a mask (its size limit): no drafts; the engine's own mask of the
      // request's next row meets the same error and fails the request with it.
      picked = 0;
    }
    walk.reset();  // the constraint as the engine left it
    drafted.resize(picked);
    conf.resize(picked);
    if (sampled) d.rows.resize(picked);
    d.tokens = std::move(drafted);
    d.confidence = std::move(conf);
  }
}

std::unique_ptr<DSparkDrafter> make_dspark_drafter(DSparkConfig c, DSparkWeights host, const std::string& where,
                                                   const ModelConfig& target, Backend& backend, Tensor embed,
                                                   LinearWeight lm_head, int64_t num_kv_blocks, int kv_block_size,
                                                   KvDType cache_dtype, int64_t num_host_kv_blocks) {
  M3_CHECK(c.vocab_size == target.vocab_size && c.hidden_size == target.hidden_size,
           "DSpark drafter {}: vocabulary {} and width {}, the target has {} and {}", where, c.vocab_size,
           c.hidden_size, target.vocab_size, target.hidden_size);
  for (int l : c.target_layer_ids)
    M3_CHECK(l < target.num_layers, "DSpark drafter {}: dspark_target_layer_ids holds {}, the target has {} layers",
             where, l, target.num_layers);
  // The backend plans one RoPE table, the target's: the drafter's frequencies must be its first ones.
  const RopeConfig& rope = target.rope;
  bool same_rope = c.rotary_dim <= rope.rotary_dim && rope.attention_factor == 1.0;
  for (int i = 0; same_rope && i < c.rotary_dim / 2; ++i) {
    const double mine = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.rotary_dim);
    same_rope = std::abs(mine - rope.inv_freq[i]) <= 1e-6 * mine;
  }
  M3_CHECK(same_rope,
           "DSpark drafter {}: its RoPE (theta {}, {} rotated channels) is not the target's (theta {}, {} channels, "
           "factor {}); m3serve's drafter shares the target's RoPE table",
           where, c.rope_theta, c.rotary_dim, rope.theta, rope.rotary_dim, rope.attention_factor);
  MarkovHeadWeights host_heads = host.heads;
  // The host keeps its copies of the heads (probabilistic drafts); to_device leaves them be on the CPU.
  DSparkWeights placed = place_dspark_weights(std::move(host), backend);
  return std::make_unique<DSparkDrafter>(std::move(c), std::move(placed), std::move(host_heads), backend,
                                         std::move(embed), std::move(lm_head), num_kv_blocks, kv_block_size,
                                         cache_dtype, num_host_kv_blocks);
}

std::unique_ptr<DSparkDrafter> load_dspark_drafter(const std::filesystem::path& dspark_dir, const ModelConfig& target,
                                                   Backend& backend, Tensor embed, LinearWeight lm_head,
                                                   int64_t num_kv_blocks, int kv_block_size, KvDType cache_dtype,
                                                   int64_t num_host_kv_blocks) {
  DSparkConfig c = load_dspark_config(dspark_dir);
  DSparkWeights w = load_dspark_weights(c, dspark_dir);
  return make_dspark_drafter(std::move(c), std::move(w), dspark_dir.string(), target, backend, std::move(embed),
                             std::move(lm_head), num_kv_blocks, kv_block_size, cache_dtype, num_host_kv_blocks);
}

KvLayout dspark_kv_layout(const DSparkConfig& c, int kv_block_size, KvDType cache_dtype) {
  return KvLayout::make(kv_block_size, c.num_kv_heads, c.head_dim, 0, cache_dtype, cache_dtype,
                        std::vector<bool>(c.num_layers, false));
}

}  // namespace m3
