// load_weights: the checkpoint's tensors -> ModelWeights. Large tensors stay zero-copy views of the
// mapped files in their stored format; norms, router weights and biases (small) become F32.
// Every tensor is checked against the config's shapes, and every checkpoint tensor must be used
// or be one the reference ignores: a missing or unexpected tensor is an error naming it.
#include "model/weights.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "formats/rows.h"
#include "model/dspark.h"
#include "model/safetensors.h"
#include "model/weight_names.h"

namespace m3 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool is_float_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

class Loader {
 public:
  Loader(const SafetensorsCheckpoint& ckpt, std::string source, LoadProgress* progress)
      : ckpt_(ckpt), source_(std::move(source)), progress_(progress) {
    for (const auto& name : ckpt_.names())
      if (!is_ignored_tensor(name)) ++total_;
  }

  bool has(const std::string& name) const { return ckpt_.contains(name); }
  bool has_linear(const std::string& base) const {
    return has(base + ".weight") || has(base + ".weight_packed");
  }

  // The tensor, marked as used; its dtype must be one of `dtypes` (any when empty).
  Tensor take(const std::string& name, const Shape& shape,
              std::initializer_list<DType> dtypes = {}) {
    const SafetensorsEntry* e = ckpt_.find(name);
    if (!e) fail("{}: missing tensor '{}'", source_, name);
    if (e->shape != shape)
      fail("{}: tensor '{}': expected shape {}, got {}", where(name), name, shape_string(shape),
           shape_string(e->shape));
    check_dtype(name, e->dtype, dtypes);
    mark_used(name);
    return ckpt_.tensor(name);
  }

  // Small tensors the model reads in fp32 (norms, router, bias): converted to an owned F32 copy.
  Tensor take_f32(const std::string& name, const Shape& shape) {
    Tensor t = take(name, shape, {DType::kF32, DType::kBF16, DType::kF16});
    Tensor out = Tensor::zeros(shape, DType::kF32);
    const int64_t n = t.numel();
    if (t.dtype() == DType::kF32)
      std::memcpy(out.data(), t.data(), n * sizeof(float));
    else if (t.dtype() == DType::kBF16)
      bf16_to_f32(t.data_as<const uint16_t>(), out.data_as<float>(), n);
    else
      fp16_to_f32(t.data_as<const uint16_t>(), out.data_as<float>(), n);
    return out;
  }

  // A one-element F32 scale tensor ([] or [1]) read as a number.
  float take_scalar(const std::string& name) {
    const SafetensorsEntry* e = ckpt_.find(name);
    if (!e) fail("{}: missing tensor '{}'", source_, name);
    if (shape_numel(e->shape) != 1 || e->shape.size() > 1)
      fail("{}: tensor '{}': expected one scale value (shape [] or [1]), got {}", where(name), name,
           shape_string(e->shape));
    Tensor t = take(name, e->shape, {DType::kF32});
    float v;
    std::memcpy(&v, t.data(), sizeof v);
    if (!std::isfinite(v) || v <= 0)
      fail("{}: tensor '{}': scale {} must be finite and positive", where(name), name, v);
    return v;
  }

  LinearWeight take_linear(const std::string& base, int64_t out, int64_t in);
  void check_all_used() const;

 private:
  std::string where(const std::string& name) const { return ckpt_.file_of(name); }

  void check_dtype(const std::string& name, DType got, std::initializer_list<DType> dtypes) const {
    if (dtypes.size() == 0) return;
    for (DType d : dtypes)
      if (d == got) return;
    std::string want;
    for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail("{}: tensor '{}': dtype {} where {} is expected", where(name), name, dtype_name(got),
         want);
  }

  void mark_used(const std::string& name) {
    if (used_.insert(name).second && progress_) progress_->on_tensor(used_.size(), total_);
  }

  const SafetensorsCheckpoint& ckpt_;
  std::string source_;
  LoadProgress* progress_;
  std::set<std::string> used_;
  std::size_t total_ = 0;
};

LinearWeight Loader::take_linear(const std::string& base, int64_t out, int64_t in) {
  LinearWeight w;
  w.name = base;
  w.out_features = out;
  w.in_features = in;
  const std::string weight = base + ".weight";
  const std::string scale = base + ".weight_scale";
  const std::string scale_inv = base + ".weight_scale_inv";
  const Shape nvfp4_packed{out, ceil_div(in, 2)};
  const Shape nvfp4_scales{out, ceil_div(in, kNvfp4Group)};

  if (has(base + ".weight_packed")) {
    // compressed-tensors NVFP4: value = e2m1 * scale / weight_global_scale.
    w.format = WeightFormat::kNvfp4;
    w.weight = take(base + ".weight_packed", nvfp4_packed, {DType::kU8});
    w.scale = take(scale, nvfp4_scales, {DType::kF8E4M3});
    w.global_divisor = take_scalar(base + ".weight_global_scale");
    w.global_scale = 1.0f / w.global_divisor;
    if (has(base + ".input_global_scale"))
      w.input_scale = take_scalar(base + ".input_global_scale");
    return w;
  }
  const SafetensorsEntry* e = ckpt_.find(weight);
  if (!e) fail("{}: missing tensor '{}' (nor '{}.weight_packed')", source_, weight, base);
  if (is_float_dtype(e->dtype)) {
    for (const auto& extra : {scale, scale_inv, base + ".weight_scale_2"})
      if (has(extra))
        fail("{}: tensor '{}' has {} values but a scale tensor '{}' too", where(weight), weight,
             dtype_name(e->dtype), extra);
    w.weight = take(weight, {out, in});
    return w;
  }
  if (e->dtype == DType::kF8E4M3) {
    w.weight = take(weight, {out, in});
    const std::string* scale_name = has(scale_inv) ? &scale_inv : has(scale) ? &scale : nullptr;
    if (has(scale_inv) && has(scale))
      fail("{}: '{}' has both weight_scale and weight_scale_inv", where(weight), base);
    if (!scale_name) {
      w.format = WeightFormat::kFp8;  // no scale: the codes are the values
    } else {
      const SafetensorsEntry* s = ckpt_.find(*scale_name);
      if (s->dtype == DType::kU8) {
        // MXFP8 (vLLM renames weight_scale_inv to weight_scale): UE8M0 per 32 along K.
        w.format = WeightFormat::kMxfp8;
        w.scale = take(*scale_name, {out, ceil_div(in, kMxfp8Block)}, {DType::kU8});
      } else if (shape_numel(s->shape) == 1 && s->shape.size() <= 1) {
        w.format = WeightFormat::kFp8;
        take_scalar(*scale_name);
        w.scale = ckpt_.tensor(*scale_name).reshape({1});
      } else {
        w.format = WeightFormat::kFp8Block;
        w.scale = take(*scale_name, {ceil_div(out, 128), ceil_div(in, 128)}, {DType::kF32});
      }
    }
    if (has(base + ".input_scale")) w.input_scale = take_scalar(base + ".input_scale");
    return w;
  }
  if (e->dtype == DType::kU8) {
    // ModelOpt NVFP4: value = e2m1 * scale * weight_scale_2.
    w.format = WeightFormat::kNvfp4;
    if (!has(scale) || !has(base + ".weight_scale_2"))
      fail("{}: '{}' is U8 (packed NVFP4) but '{}' and '{}.weight_scale_2' are not both present",
           where(weight), weight, scale, base);
    w.weight = take(weight, nvfp4_packed, {DType::kU8});
    w.scale = take(scale, nvfp4_scales, {DType::kF8E4M3});
    w.global_scale = take_scalar(base + ".weight_scale_2");
    if (has(base + ".input_scale")) w.input_scale = take_scalar(base + ".input_scale");
    return w;
  }
  fail("{}: tensor '{}': dtype {} is not a supported weight format", where(weight), weight,
       dtype_name(e->dtype));
}

void Loader::check_all_used() const {
  std::vector<std::string> unexpected;
  for (const auto& name : ckpt_.names())
    if (!used_.count(name) && !is_ignored_tensor(name)) unexpected.push_back(name);
  if (unexpected.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < unexpected.size() && i < 8; ++i)
    list += fmt::format("\n  {} ({})", unexpected[i], ckpt_.file_of(unexpected[i]));
  if (unexpected.size() > 8) list += fmt::format("\n  ... and {} more", unexpected.size() - 8);
  fail("{}: {} unexpected tensor(s) the config does not explain:{}", source_, unexpected.size(),
       list);
}

// SwiGLU pair: fused gate_up_proj (gate = first half) or separate gate_proj / up_proj.
void take_gate_up(Loader& ld, const std::string& base, int64_t width, int64_t hidden,
                  LinearWeight& gate, LinearWeight& up) {
  if (ld.has_linear(base + "gate_up_proj")) {
    LinearWeight fused = ld.take_linear(base + "gate_up_proj", 2 * width, hidden);
    gate = fused.rows(0, width);
    up = fused.rows(width, 2 * width);
  } else {
    gate = ld.take_linear(base + "gate_proj", width, hidden);
    up = ld.take_linear(base + "up_proj", width, hidden);
  }
}

void load_attention(Loader& ld, const ModelConfig& c, const std::string& L, bool sparse,
                    AttentionWeights& a) {
  const int64_t hidden = c.hidden_size, hd = c.head_dim;
  const std::string p = L + "self_attn.";
  a.q = ld.take_linear(p + "q_proj", c.num_heads * hd, hidden);
  a.k = ld.take_linear(p + "k_proj", c.num_kv_heads * hd, hidden);
  a.v = ld.take_linear(p + "v_proj", c.num_kv_heads * hd, hidden);
  a.o = ld.take_linear(p + "o_proj", hidden, c.num_heads * hd);
  a.q_norm = ld.take_f32(p + "q_norm.weight", {hd});
  a.k_norm = ld.take_f32(p + "k_norm.weight", {hd});
  if (!sparse) return;
  const int64_t ihd = c.index_head_dim;
  // Release spelling index_{q,k}_proj / index_{q,k}_norm, or the reference's indexer.*.
  const bool release = ld.has_linear(p + "index_q_proj");
  const std::string q_proj = release ? p + "index_q_proj" : p + "indexer.q_proj";
  const std::string k_proj = release ? p + "index_k_proj" : p + "indexer.k_proj";
  const std::string q_norm = release ? p + "index_q_norm" : p + "indexer.q_norm";
  const std::string k_norm = release ? p + "index_k_norm" : p + "indexer.k_norm";
  a.index_q = ld.take_linear(q_proj, c.index_heads * ihd, hidden);
  a.index_k = ld.take_linear(k_proj, ihd, hidden);
  a.index_q_norm = ld.take_f32(q_norm + ".weight", {ihd});
  a.index_k_norm = ld.take_f32(k_norm + ".weight", {ihd});
}

void load_moe(Loader& ld, const ModelConfig& c, const std::string& L, MlpWeights& m) {
  const int64_t hidden = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  // Release: block_sparse_moe.*, bias beside the gate; save_pretrained: mlp.*, bias in the gate.
  const std::string b =
      ld.has(L + "block_sparse_moe.gate.weight") ? L + "block_sparse_moe." : L + "mlp.";
  m.router = ld.take_f32(b + "gate.weight", {E, hidden});
  const std::string bias = ld.has(b + "e_score_correction_bias")
                               ? b + "e_score_correction_bias"
                               : b + "gate.e_score_correction_bias";
  m.router_bias = ld.take_f32(bias, {E});
  take_gate_up(ld, b + "shared_experts.", c.shared_intermediate_size, hidden, m.gate, m.up);
  m.down = ld.take_linear(b + "shared_experts.down_proj", hidden, c.shared_intermediate_size);

  m.experts.resize(E);
  if (ld.has(b + "experts.gate_up_proj")) {
    // 3-D [E, 2I, H] and [E, H, I] (save_pretrained): one zero-copy view per expert.
    const std::initializer_list<DType> floats = {DType::kF32, DType::kBF16, DType::kF16};
    Tensor gate_up = ld.take(b + "experts.gate_up_proj", {E, 2 * I, hidden}, floats);
    Tensor down = ld.take(b + "experts.down_proj", {E, hidden, I}, floats);
    for (int64_t e = 0; e < E; ++e) {
      LinearWeight gu;
      gu.name = fmt::format("{}experts.gate_up_proj[{}]", b, e);
      gu.out_features = 2 * I;
      gu.in_features = hidden;
      gu.weight = gate_up.rows(e, e + 1).reshape({2 * I, hidden});
      m.experts[e].gate = gu.rows(0, I);
      m.experts[e].up = gu.rows(I, 2 * I);
      LinearWeight& d = m.experts[e].down;
      d.name = fmt::format("{}experts.down_proj[{}]", b, e);
      d.out_features = hidden;
      d.in_features = I;
      d.weight = down.rows(e, e + 1).reshape({hidden, I});
    }
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = fmt::format("{}experts.{}.", b, e);
    m.experts[e].gate = ld.take_linear(x + "w1", I, hidden);
    m.experts[e].up = ld.take_linear(x + "w3", I, hidden);
    m.experts[e].down = ld.take_linear(x + "w2", hidden, I);
  }
}

}  // namespace

ModelWeights load_weights(const ModelConfig& config, const std::filesystem::path& model_dir,
                          LoadProgress* progress) {
  const auto start = std::chrono::steady_clock::now();
  // The model directory may be named by its config.json, as load_model_config accepts.
  const std::filesystem::path dir =
      model_dir.filename() == "config.json" ? model_dir.parent_path() : model_dir;
  auto ckpt = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(dir));
  const CheckpointLayout layout = detect_checkpoint_layout(ckpt->names());
  const std::string source = "checkpoint " + dir.string();
  Loader ld(*ckpt, source, progress);
  const int64_t hidden = config.hidden_size;

  ModelWeights w;
  w.keep_alive.push_back(ckpt);
  w.embed = ld.take(layout.model_prefix + "embed_tokens.weight", {config.vocab_size, hidden},
                    {DType::kF32, DType::kBF16, DType::kF16});
  w.final_norm = ld.take_f32(layout.model_prefix + "norm.weight", {hidden});
  if (config.tie_word_embeddings) {
    if (ld.has_linear(layout.lm_head)) {
      M3_LOG_WARN("{}: tie_word_embeddings is true; ignoring '{}' in favour of the embedding",
                  source, layout.lm_head + ".weight");
      ld.take(layout.lm_head + ".weight", {config.vocab_size, hidden});
    }
    w.lm_head.name = layout.model_prefix + "embed_tokens";
    w.lm_head.out_features = config.vocab_size;
    w.lm_head.in_features = hidden;
    w.lm_head.weight = w.embed;
  } else {
    // A VL wrapper may keep its head outside the language model (plain lm_head.weight).
    const std::string head =
        !ld.has_linear(layout.lm_head) && ld.has_linear("lm_head") ? "lm_head" : layout.lm_head;
    w.lm_head = ld.take_linear(head, config.vocab_size, hidden);
  }

  w.layers.resize(config.num_layers);
  for (int i = 0; i < config.num_layers; ++i) {
    const std::string L = layout.layer(i);
    LayerWeights& lw = w.layers[i];
    lw.input_norm = ld.take_f32(L + "input_layernorm.weight", {hidden});
    lw.post_attn_norm = ld.take_f32(L + "post_attention_layernorm.weight", {hidden});
    load_attention(ld, config, L, config.attention_kinds[i] == AttentionKind::kSparse, lw.attn);
    if (config.mlp_kinds[i] == MlpKind::kMoe) {
      load_moe(ld, config, L, lw.mlp);
    } else {
      // Dense MLPs sit under mlp. (release, save_pretrained of the text model) or, as the VL
      // wrapper's save_pretrained writes them, under block_sparse_moe.
      const bool moe_prefix =
          !ld.has_linear(L + "mlp.down_proj") && ld.has_linear(L + "block_sparse_moe.down_proj");
      const std::string D = moe_prefix ? L + "block_sparse_moe." : L + "mlp.";
      take_gate_up(ld, D, config.dense_intermediate_size, hidden, lw.mlp.gate, lw.mlp.up);
      lw.mlp.down = ld.take_linear(D + "down_proj", hidden, config.dense_intermediate_size);
    }
  }
  ld.check_all_used();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  M3_LOG_INFO("loaded {} tensors from {} file(s) of {} ({} layout) in {:.0f} ms", ckpt->size(),
              ckpt->files().size(), dir.string(), layout.model_prefix, ms);
  return w;
}

namespace {

// Backend::to_device once per distinct host buffer (tied embeddings share one).
class WeightPlacer {
 public:
  explicit WeightPlacer(Backend& backend) : backend_(backend) {}
  void operator()(Tensor& t, const std::string& name) {
    if (!t.defined() || t.device() == backend_.device()) return;
    auto it = done_.find(t.data());
    if (it != done_.end() && it->second.nbytes() == t.nbytes()) {
      t = it->second.reshape(t.shape());
      return;
    }
    Tensor d = backend_.to_device(t, name);
    bytes_ += static_cast<int64_t>(t.nbytes());
    done_.emplace(t.data(), d);
    t = std::move(d);
  }
  void operator()(LinearWeight& w) {
    (*this)(w.weight, w.name + ".weight");
    (*this)(w.scale, w.name + ".weight_scale");
  }
  int64_t bytes() const { return bytes_; }

 private:
  Backend& backend_;
  std::unordered_map<const void*, Tensor> done_;
  int64_t bytes_ = 0;
};

}  // namespace

ModelWeights place_weights(ModelWeights w, Backend& backend) {
  WeightPlacer place(backend);
  place(w.embed, "embed_tokens");
  place(w.final_norm, "norm");
  place(w.lm_head);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    place(l.input_norm, p + "input_layernorm");
    place(l.post_attn_norm, p + "post_attention_layernorm");
    for (LinearWeight* x : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.attn.index_q, &l.attn.index_k}) place(*x);
    place(l.attn.q_norm, p + "q_norm");
    place(l.attn.k_norm, p + "k_norm");
    place(l.attn.index_q_norm, p + "index_q_norm");
    place(l.attn.index_k_norm, p + "index_k_norm");
    for (LinearWeight* x : {&l.mlp.gate, &l.mlp.up, &l.mlp.down}) place(*x);
    place(l.mlp.router, p + "router");
    place(l.mlp.router_bias, p + "e_score_correction_bias");
    for (ExpertWeights& e : l.mlp.experts)
      for (LinearWeight* x : {&e.gate, &e.up, &e.down}) place(*x);
  }
  if (place.bytes() > 0) {
    // The host buffers (mmaps, converted copies) are no longer referenced.
    w.keep_alive.clear();
    M3_LOG_INFO("weights on the {} backend: {:.2f} GiB", backend.name(), place.bytes() / 1073741824.0);
  }
  return w;
}

}  // namespace m3

namespace m3 {

DSparkWeights load_dspark_weights(const DSparkConfig& c, const std::filesystem::path& dir) {
  auto ckpt = std::make_shared<const SafetensorsCheckpoint>(SafetensorsCheckpoint::open(dir));
  Loader ld(*ckpt, "DSpark drafter " + dir.string(), nullptr);
  const std::string p = "language_model.model.dspark.";
  const int64_t h = c.hidden_size, q = int64_t(c.num_heads) * c.head_dim, kv = int64_t(c.num_kv_heads) * c.head_dim;
  DSparkWeights w;
  w.keep_alive.push_back(ckpt);
  const int taps = static_cast<int>(c.target_layer_ids.size());
  const LinearWeight fc = ld.take_linear(p + "fc", h, int64_t(taps) * h);
  // fc's columns of each tap: the drafter applies them as the target's layers pass the taps.
  for (int i = 0; i < taps; ++i) w.fc.push_back(taps == 1 ? fc : fc.columns(int64_t(i) * h, int64_t(i + 1) * h));
  w.hidden_norm = ld.take_f32(p + "hidden_norm.weight", {h});
  w.final_norm = ld.take_f32(p + "norm.weight", {h});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string b = p + "layers." + std::to_string(l) + ".";
    DSparkLayerWeights lw;
    lw.input_norm = ld.take_f32(b + "input_layernorm.weight", {h});
    lw.post_attn_norm = ld.take_f32(b + "post_attention_layernorm.weight", {h});
    lw.q_norm = ld.take_f32(b + "self_attn.q_norm.weight", {c.head_dim});
    lw.k_norm = ld.take_f32(b + "self_attn.k_norm.weight", {c.head_dim});
    lw.q = ld.take_linear(b + "self_attn.q_proj", q, h);
    lw.k = ld.take_linear(b + "self_attn.k_proj", kv, h);
    lw.v = ld.take_linear(b + "self_attn.v_proj", kv, h);
    lw.o = ld.take_linear(b + "self_attn.o_proj", h, q);
    lw.gate = ld.take_linear(b + "mlp.gate_proj", c.intermediate_size, h);
    lw.up = ld.take_linear(b + "mlp.up_proj", c.intermediate_size, h);
    lw.down = ld.take_linear(b + "mlp.down_proj", h, c.intermediate_size);
    w.layers.push_back(std::move(lw));
  }
  w.heads.w1 = ld.take_f32(p + "markov_head.w1.weight", {c.vocab_size, c.markov_rank});
  w.heads.w2 = ld.take_f32(p + "markov_head.w2.weight", {c.vocab_size, c.markov_rank});
  const int64_t conf_in = h + (c.confidence_with_markov ? c.markov_rank : 0);
  w.heads.confidence_w = ld.take_f32(p + "confidence_head.proj.weight", {1, conf_in}).reshape({conf_in});
  w.heads.confidence_b = ld.take_f32(p + "confidence_head.proj.bias", {1}).data_as<const float>()[0];
  w.heads.confidence_with_markov = c.confidence_with_markov;
  ld.check_all_used();
  return w;
}

DSparkWeights place_dspark_weights(DSparkWeights w, Backend& backend) {
  WeightPlacer place(backend);
  for (size_t i = 0; i < w.fc.size(); ++i) place(w.fc[i]);
  place(w.hidden_norm, "dspark.hidden_norm");
  place(w.final_norm, "dspark.norm");
  for (size_t l = 0; l < w.layers.size(); ++l) {
    DSparkLayerWeights& lw = w.layers[l];
    const std::string b = "dspark.layers." + std::to_string(l) + ".";
    place(lw.input_norm, b + "input_layernorm");
    place(lw.post_attn_norm, b + "post_attention_layernorm");
    place(lw.q_norm, b + "q_norm");
    place(lw.k_norm, b + "k_norm");
    for (LinearWeight* x : {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down}) place(*x);
  }
  place(w.heads.w1, "dspark.markov_head.w1");
  place(w.heads.w2, "dspark.markov_head.w2");
  place(w.heads.confidence_w, "dspark.confidence_head");
  if (place.bytes() > 0) w.keep_alive.clear();
  return w;
}

}  // namespace m3
