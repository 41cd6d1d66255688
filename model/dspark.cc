#include "model/dspark.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/bf16.h"
#include "formats/fp8_e4m3.h"
#include "formats/rows.h"
#include "model/config_fields.h"
#include "model/weights.h"

namespace m3 {
namespace {

using config_detail::Fields;

int required_int(const Fields& f, const char* key) {
  const std::optional<int64_t> v = f.opt_int(key);
  if (!v) f.reject(key, "required");
  if (*v <= 0 || *v > (int64_t(1) << 30)) f.reject(key, "must be a positive integer");
  return static_cast<int>(*v);
}

// Sum of a[i] b[i] in eight interleaved fp32 partial sums (vectorizes; a fixed order, so the
// result does not depend on threads or batch).
float dot(const float* a, const float* b, int64_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y[o] = sum_i w[o, i] x[i], w row-major [out, in]; wide outputs (the lm_head) over threads.
void matvec(const std::vector<float>& w, const float* x, int64_t in, int64_t out, float* y) {
#pragma omp parallel for schedule(static) if (out * in >= (int64_t(1) << 21))
  for (int64_t o = 0; o < out; ++o) y[o] = dot(w.data() + o * in, x, in);
}

// Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), over `n` values, in place.
void rms_norm(float* x, int64_t n, const std::vector<float>& w, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * inv * (1.0f + w[i]);
}

float swiglu_oai(float gate, float up, float alpha, float limit) {
  gate = std::min(gate, limit);
  up = std::clamp(up, -limit, limit);
  return (up + 1.0f) * (gate / (1.0f + std::exp(-alpha * gate)));
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

DSparkDrafter::DSparkDrafter(DSparkConfig config, DSparkWeights weights, std::vector<float> embed,
                             std::vector<float> lm_head, int64_t num_slots, int kv_block_size, KvDType cache_dtype)
    : config_(std::move(config)),
      w_(std::move(weights)),
      embed_(std::move(embed)),
      lm_head_(std::move(lm_head)),
      num_slots_(num_slots),
      kv_block_size_(kv_block_size),
      cache_dtype_(cache_dtype) {
  const DSparkConfig& c = config_;
  const auto vh = static_cast<size_t>(c.vocab_size) * c.hidden_size;
  M3_CHECK(embed_.size() == vh && lm_head_.size() == vh, "DSpark drafter: the target's embed / lm_head must be [{}, {}]",
           c.vocab_size, c.hidden_size);
  M3_CHECK(num_slots > 0 && kv_block_size > 0, "DSpark drafter: {} KV slots in blocks of {}", num_slots, kv_block_size);
  M3_CHECK(cache_dtype != KvDType::kNVFP4, "DSpark drafter: its cache holds float32, bfloat16 or fp8, not nvfp4");
  for (int i = 0; i < c.rotary_dim / 2; ++i)
    inv_freq_.push_back(1.0f / static_cast<float>(std::pow(c.rope_theta, (2.0 * i) / c.rotary_dim)));
  row_bytes_ = kv_data_bytes(cache_dtype, c.num_kv_heads * c.head_dim);
  blocks_.resize(static_cast<size_t>((num_slots + kv_block_size - 1) / kv_block_size));
}

uint8_t* DSparkDrafter::row_at(int layer, int which, int64_t slot) const {
  return blocks_[slot / kv_block_size_].get() +
         ((int64_t(layer) * 2 + which) * kv_block_size_ + slot % kv_block_size_) * row_bytes_;
}

void DSparkDrafter::store(int layer, int which, int64_t slot, const float* row) {
  const int n = config_.num_kv_heads * config_.head_dim;
  uint8_t* out = row_at(layer, which, slot);
  switch (cache_dtype_) {
    case KvDType::kF32: std::memcpy(out, row, size_t(n) * 4); break;
    case KvDType::kBF16:
      for (int i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(out)[i] = bf16_encode(row[i]);
      break;
    default:
      for (int i = 0; i < n; ++i) out[i] = fp8_e4m3_encode(row[i]);
      break;
  }
}

void DSparkDrafter::load(int layer, int which, int64_t slot, float* row) const {
  const int n = config_.num_kv_heads * config_.head_dim;
  const uint8_t* in = row_at(layer, which, slot);
  switch (cache_dtype_) {
    case KvDType::kF32: std::memcpy(row, in, size_t(n) * 4); break;
    case KvDType::kBF16:
      for (int i = 0; i < n; ++i) row[i] = bf16_decode(reinterpret_cast<const uint16_t*>(in)[i]);
      break;
    default:
      for (int i = 0; i < n; ++i) row[i] = fp8_e4m3_decode(in[i]);
      break;
  }
}

void DSparkDrafter::rope(float* x, int heads, int32_t pos) const {
  const int d = config_.head_dim, half = config_.rotary_dim / 2;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<size_t>(h) * d;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq_[i];
      const float cs = std::cos(angle), sn = std::sin(angle);
      const float a = v[i], b = v[i + half];
      v[i] = a * cs - b * sn;
      v[i + half] = b * cs + a * sn;
    }
  }
}

void DSparkDrafter::copy_blocks(const KvBlockCopies& copies) {
  const auto bytes = static_cast<size_t>(config_.num_layers) * 2 * kv_block_size_ * row_bytes_;
  auto to_host = [&](const KvBlockCopy& c) {
    M3_CHECK(c.block >= 0 && c.block < static_cast<int64_t>(blocks_.size()) && c.host_slot >= 0,
             "DSpark drafter: copy of block {} to host slot {}", c.block, c.host_slot);
    if (c.host_slot >= static_cast<int64_t>(host_slots_.size())) host_slots_.resize(c.host_slot + 1);
    std::unique_ptr<uint8_t[]>& slot = host_slots_[c.host_slot];
    const std::unique_ptr<uint8_t[]>& block = blocks_[c.block];
    if (!block) return slot.reset();  // never written: nothing to keep
    if (!slot) slot = std::make_unique<uint8_t[]>(bytes);
    std::memcpy(slot.get(), block.get(), bytes);
  };
  for (const KvBlockCopy& c : copies.to_host) to_host(c);
  for (const KvBlockCopy& c : copies.to_host_ahead) to_host(c);
  for (const KvBlockCopy& c : copies.to_device) {
    M3_CHECK(c.block >= 0 && c.block < static_cast<int64_t>(blocks_.size()) && c.host_slot >= 0 &&
                 c.host_slot < static_cast<int64_t>(host_slots_.size()) && host_slots_[c.host_slot],
             "DSpark drafter: host slot {} holds nothing to bring back into block {}", c.host_slot, c.block);
    if (!blocks_[c.block]) blocks_[c.block] = std::make_unique<uint8_t[]>(bytes);
    std::memcpy(blocks_[c.block].get(), host_slots_[c.host_slot].get(), bytes);
  }
}

void DSparkDrafter::ingest(const StepBatch& batch, std::span<const float> taps) {
  const DSparkConfig& c = config_;
  const int64_t h = c.hidden_size, in = static_cast<int64_t>(c.target_layer_ids.size()) * h;
  const int64_t tokens = batch.num_tokens();
  M3_CHECK(static_cast<int64_t>(taps.size()) == tokens * in, "DSpark drafter: {} tokens need {} tap values, got {}",
           tokens, tokens * in, taps.size());
  const int64_t kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const auto block_bytes = static_cast<size_t>(c.num_layers) * 2 * kv_block_size_ * row_bytes_;
  for (int64_t t = 0; t < tokens; ++t) {  // before the threads: a block's first write allocates it
    const int64_t slot = batch.slot_mapping[t];
    if (slot >= 0 && slot < num_slots_ && !blocks_[slot / kv_block_size_])
      blocks_[slot / kv_block_size_] = std::make_unique<uint8_t[]>(block_bytes);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = batch.slot_mapping[t];
    if (slot < 0 || slot >= num_slots_) continue;  // a padded row
    std::vector<float> ctx(h), k(kv), v(kv);
    matvec(w_.fc, taps.data() + t * in, in, h, ctx.data());
    rms_norm(ctx.data(), h, w_.hidden_norm, c.rms_norm_eps);
    for (int l = 0; l < c.num_layers; ++l) {
      const DSparkLayerWeights& lw = w_.layers[l];
      matvec(lw.k, ctx.data(), h, kv, k.data());
      for (int g = 0; g < c.num_kv_heads; ++g) rms_norm(k.data() + g * c.head_dim, c.head_dim, lw.k_norm, c.rms_norm_eps);
      rope(k.data(), c.num_kv_heads, batch.positions[t]);
      store(l, 0, slot, k.data());
      matvec(lw.v, ctx.data(), h, kv, v.data());
      store(l, 1, slot, v.data());
    }
  }
}

DSparkDrafts DSparkDrafter::propose(const DSparkBlock& block, bool keep_logits) const {
  const DSparkConfig& c = config_;
  const int n = c.block_size, d = c.head_dim, hq = c.num_heads, g = c.num_kv_heads, group = hq / g;
  const int64_t h = c.hidden_size, kv = static_cast<int64_t>(g) * d, inter = c.intermediate_size;
  M3_CHECK(block.num_drafts >= 1 && block.num_drafts <= n, "DSpark drafter: {} drafts from a block of {}",
           block.num_drafts, n);
  M3_CHECK(block.anchor >= 0 && block.anchor < c.vocab_size && block.anchor_pos >= 1,
           "DSpark drafter: anchor {} at position {}", block.anchor, block.anchor_pos);
  const int32_t p = block.anchor_pos - 1;  // the last committed position
  // The context slots, oldest first: positions [max(0, first query's window start), p].
  const int32_t first = std::max<int32_t>(0, block.anchor_pos - (c.sliding_window - 1));
  std::vector<int64_t> ctx_slots;
  std::vector<int32_t> ctx_pos;
  for (int32_t pos = first; pos <= p; ++pos) {
    const size_t page = static_cast<size_t>(pos / kv_block_size_);
    M3_CHECK(page < block.block_table.size(), "DSpark drafter: position {} is past the request's {} blocks", pos,
             block.block_table.size());
    const int64_t slot = int64_t(block.block_table[page]) * kv_block_size_ + pos % kv_block_size_;
    M3_CHECK(slot >= 0 && slot < num_slots_ && blocks_[slot / kv_block_size_],
             "DSpark drafter: context position {} (slot {}) was never computed by the target", pos, slot);
    ctx_slots.push_back(slot);
    ctx_pos.push_back(pos);
  }

  // x: the block's hidden states [n, h], starting from the target's embeddings.
  std::vector<float> x(static_cast<size_t>(n) * h);
  for (int j = 0; j < n; ++j) {
    const int32_t id = j == 0 ? block.anchor : c.noise_token_id;
    std::copy_n(embed_.begin() + static_cast<int64_t>(id) * h, h, x.begin() + j * h);
  }
  std::vector<float> hn(h), q(static_cast<size_t>(n) * hq * d), bk(static_cast<size_t>(n) * kv),
      bv(static_cast<size_t>(n) * kv), attn(static_cast<size_t>(hq) * d), o(h), gate(inter), up(inter), act(inter);
  std::vector<float> scores, kctx, vctx;
  for (int l = 0; l < c.num_layers; ++l) {
    const DSparkLayerWeights& lw = w_.layers[l];
    for (int j = 0; j < n; ++j) {
      std::copy_n(x.begin() + j * h, h, hn.begin());
      rms_norm(hn.data(), h, lw.input_norm, c.rms_norm_eps);
      float* qj = q.data() + static_cast<size_t>(j) * hq * d;
      matvec(lw.q, hn.data(), h, int64_t(hq) * d, qj);
      matvec(lw.k, hn.data(), h, kv, bk.data() + j * kv);
      matvec(lw.v, hn.data(), h, kv, bv.data() + j * kv);
      for (int a = 0; a < hq; ++a) rms_norm(qj + a * d, d, lw.q_norm, c.rms_norm_eps);
      for (int a = 0; a < g; ++a) rms_norm(bk.data() + j * kv + a * d, d, lw.k_norm, c.rms_norm_eps);
      rope(qj, hq, block.anchor_pos + j);
      rope(bk.data() + j * kv, g, block.anchor_pos + j);
    }
    // The context's K and V of this layer, as the cache holds them, read once.
    kctx.resize(ctx_slots.size() * kv);
    vctx.resize(ctx_slots.size() * kv);
    for (size_t i = 0; i < ctx_slots.size(); ++i) {
      load(l, 0, ctx_slots[i], kctx.data() + i * kv);
      load(l, 1, ctx_slots[i], vctx.data() + i * kv);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int j = 0; j < n; ++j) {
      const int32_t q_pos = block.anchor_pos + j;
      const int32_t lo = q_pos - (c.sliding_window - 1);  // the window's oldest key position
      for (int a = 0; a < hq; ++a) {
        const int kvh = a / group;
        const float* qa = q.data() + (static_cast<size_t>(j) * hq + a) * d;
        // Context keys in the window, then the block's keys (all of them: non-causal).
        scores.clear();
        float mx = -std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < ctx_slots.size(); ++i) {
          if (ctx_pos[i] < lo) {
            scores.push_back(-std::numeric_limits<float>::infinity());
            continue;
          }
          scores.push_back(dot(qa, kctx.data() + i * kv + kvh * d, d) * scale);
          mx = std::max(mx, scores.back());
        }
        for (int b = 0; b < n; ++b) {
          scores.push_back(dot(qa, bk.data() + b * kv + kvh * d, d) * scale);
          mx = std::max(mx, scores.back());
        }
        double sum = 0.0;
        for (float& s : scores) sum += (s = std::exp(s - mx));
        float* out = attn.data() + a * d;
        std::fill(out, out + d, 0.0f);
        for (size_t i = 0; i < scores.size(); ++i) {
          const float wgt = static_cast<float>(scores[i] / sum);
          if (wgt == 0.0f) continue;
          const float* vr = i < ctx_slots.size() ? vctx.data() + i * kv + kvh * d
                                                 : bv.data() + (i - ctx_slots.size()) * kv + kvh * d;
          for (int e = 0; e < d; ++e) out[e] += wgt * vr[e];
        }
      }
      matvec(lw.o, attn.data(), int64_t(hq) * d, h, o.data());
      for (int64_t e = 0; e < h; ++e) x[j * h + e] += o[e];
    }
    for (int j = 0; j < n; ++j) {
      std::copy_n(x.begin() + j * h, h, hn.begin());
      rms_norm(hn.data(), h, lw.post_attn_norm, c.rms_norm_eps);
      matvec(lw.gate, hn.data(), h, inter, gate.data());
      matvec(lw.up, hn.data(), h, inter, up.data());
      for (int64_t e = 0; e < inter; ++e) act[e] = swiglu_oai(gate[e], up[e], c.swiglu_alpha, c.swiglu_limit);
      matvec(lw.down, act.data(), inter, h, o.data());
      for (int64_t e = 0; e < h; ++e) x[j * h + e] += o[e];
    }
  }

  DSparkDrafts out;
  const int64_t v = c.vocab_size, r = c.markov_rank;
  std::vector<float> logits(v);
  if (keep_logits) out.base_logits.resize(static_cast<size_t>(n) * v);
  int32_t prev = block.anchor;
  for (int j = 0; j < n; ++j) {
    std::copy_n(x.begin() + j * h, h, hn.begin());
    rms_norm(hn.data(), h, w_.final_norm, c.rms_norm_eps);
    matvec(lm_head_, hn.data(), h, v, logits.data());
    if (keep_logits) std::copy(logits.begin(), logits.end(), out.base_logits.begin() + j * v);
    if (j >= block.num_drafts && !keep_logits) break;
    const float* w1 = w_.markov_w1.data() + static_cast<int64_t>(prev) * r;
    double conf = w_.confidence_b;
    for (int64_t e = 0; e < h; ++e) conf += static_cast<double>(w_.confidence_w[e]) * hn[e];
    if (c.confidence_with_markov)
      for (int64_t e = 0; e < r; ++e) conf += static_cast<double>(w_.confidence_w[h + e]) * w1[e];
    int32_t best = 0;
    float best_logit = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < v; ++t) {
      logits[t] += dot(w_.markov_w2.data() + t * r, w1, r);
      if (logits[t] > best_logit) best_logit = logits[t], best = static_cast<int32_t>(t);  // the lowest id on a tie
    }
    if (block.sampling && j < block.num_drafts && !sample_row_greedy(*block.sampling)) {
      SampleRow row;  // the drafter's own distribution: no penalties, masks or biases
      row.temperature = block.sampling->temperature;
      row.top_k = block.sampling->top_k;
      row.top_p = block.sampling->top_p;
      row.min_p = block.sampling->min_p;
      SampleBatch batch;
      batch.add(row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
      SampleWorkspace ws;
      out.rows.emplace_back();
      sample_distribution(logits.data(), static_cast<int32_t>(v), batch.rows[0], batch, ws, out.rows.back());
      M3_CHECK(j < static_cast<int>(block.draw_uniforms.size()), "DSpark drafter: {} draws for {} drafts",
               block.draw_uniforms.size(), block.num_drafts);
      best = out.rows.back().draw(block.draw_uniforms[j]);
    }
    if (j < block.num_drafts) {
      out.tokens.push_back(best);
      out.confidence.push_back(static_cast<float>(1.0 / (1.0 + std::exp(-conf))));
    }
    prev = best;
  }
  return out;
}

std::unique_ptr<DSparkDrafter> make_dspark_drafter(const std::filesystem::path& dspark_dir,
                                                   const ModelConfig& target, const ModelWeights& tw,
                                                   int64_t num_slots, int kv_block_size, KvDType cache_dtype) {
  DSparkConfig c = load_dspark_config(dspark_dir);
  const std::string where = dspark_dir.string();
  M3_CHECK(c.vocab_size == target.vocab_size && c.hidden_size == target.hidden_size,
           "DSpark drafter {}: vocabulary {} and width {}, the target has {} and {}", where, c.vocab_size,
           c.hidden_size, target.vocab_size, target.hidden_size);
  for (int l : c.target_layer_ids)
    M3_CHECK(l < target.num_layers, "DSpark drafter {}: dspark_target_layer_ids holds {}, the target has {} layers",
             where, l, target.num_layers);
  DSparkWeights w = load_dspark_weights(c, dspark_dir);
  const auto n = static_cast<size_t>(target.vocab_size) * target.hidden_size;
  M3_CHECK(tw.embed.device() == Device::kCpu && tw.lm_head.weight.device() == Device::kCpu,
           "DSpark drafter: the target's embedding and lm_head must be read on the host");
  std::vector<float> embed(n), head(n);
  if (tw.embed.dtype() == DType::kF32) {
    std::copy_n(tw.embed.data_as<const float>(), n, embed.data());
  } else if (tw.embed.dtype() == DType::kBF16) {
    bf16_to_f32(tw.embed.data_as<const uint16_t>(), embed.data(), n);
  } else {
    fp16_to_f32(tw.embed.data_as<const uint16_t>(), embed.data(), n);
  }
  dequantize_rows(tw.lm_head, 0, tw.lm_head.out_features, head.data());
  return std::make_unique<DSparkDrafter>(std::move(c), std::move(w), std::move(embed), std::move(head), num_slots,
                                         kv_block_size, cache_dtype);
}

}  // namespace m3
