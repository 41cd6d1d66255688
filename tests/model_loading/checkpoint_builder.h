// Builds tiny MiniMax-M3 checkpoints in every on-disk layout and weight format, remembering the
// value every tensor must dequantize to (computed here from the format definitions).
#pragma once
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "formats/rows.h"
#include "model/config.h"
#include "tests/model_loading/test_util.h"

namespace m3::testing {

enum class Layout { kRelease, kTextSavePretrained, kVlSavePretrained };

enum class Fmt {
  kBf16,
  kF32,
  kMxfp8,         // weight + weight_scale_inv (U8)
  kMxfp8Renamed,  // weight + weight_scale (U8), vLLM's spelling
  kFp8Tensor,     // weight + weight_scale (F32 [1]) + input_scale
  kFp8Block,      // weight + weight_scale_inv (F32 [ceil(out/128), ceil(in/128)])
  kNvfp4Ct,       // weight_packed + weight_scale + weight_global_scale
  kNvfp4ModelOpt  // weight (U8) + weight_scale + weight_scale_2 + input_scale
};

struct BuildOptions {
  Layout layout = Layout::kRelease;
  Fmt linear = Fmt::kBf16;  // attention, indexer, dense MLP, shared experts, lm_head
  Fmt expert =
      Fmt::kBf16;  // routed experts (release layout; save_pretrained experts are 3-D floats)
  bool fused_dense = false;  // release layout: mlp.gate_up_proj instead of gate_proj / up_proj
  bool dense_in_moe_block =
      false;           // release layout: dense MLP under block_sparse_moe. (VL save_pretrained)
  bool extras = true;  // add vision / projector / mtp tensors the loader must ignore
  uint64_t seed = 1;
};

// Expected fp32 values by logical key: "embed", "final_norm", "lm_head", "L1.q", "L1.q_norm",
// "L1.index_q", "L0.gate" (dense or shared), "L1.router", "L1.router_bias", "L1.e2.down", ...
using Expected = std::map<std::string, std::vector<float>>;

class CheckpointBuilder {
 public:
  CheckpointBuilder(const ModelConfig& c, BuildOptions o) : c_(c), o_(o), rng_(o.seed) {}

  SafetensorsWriter& writer() { return w_; }
  const Expected& expected() const { return expected_; }

  void build() {
    const int64_t H = c_.hidden_size;
    const std::string P = prefix();
    expected_["embed"] =
        w_.add_bf16(P + "embed_tokens.weight", {c_.vocab_size, H}, random(c_.vocab_size * H, 1.0f));
    norm(P + "norm.weight", "final_norm", H);
    if (!c_.tie_word_embeddings) linear(lm_head(), "lm_head", c_.vocab_size, H, o_.linear);
    for (int i = 0; i < c_.num_layers; ++i) layer(i);
    if (o_.extras) {
      w_.add_bf16(P + "mtp.layers.0.eh_proj.weight", {4, 4}, random(16, 1));
      w_.add_bf16(vision_prefix() + "vision_tower.vision_model.pre_layrnorm.weight", {4},
                  random(4, 1));
      w_.add_bf16(vision_prefix() + "multi_modal_projector.linear_1.weight", {4, 4}, random(16, 1));
      w_.add_bf16(vision_prefix() + "patch_merge_mlp.linear_1.weight", {4, 4}, random(16, 1));
    }
  }

  std::string prefix() const {
    switch (o_.layout) {
      case Layout::kRelease:
        return "language_model.model.";
      case Layout::kVlSavePretrained:
        return "model.language_model.";
      case Layout::kTextSavePretrained:
        return "model.";
    }
    return "";
  }
  std::string lm_head() const {
    return o_.layout == Layout::kRelease ? "language_model.lm_head" : "lm_head";
  }
  std::string layer_prefix(int i) const { return prefix() + "layers." + std::to_string(i) + "."; }

 private:
  bool release() const { return o_.layout == Layout::kRelease; }
  std::string vision_prefix() const {
    return o_.layout == Layout::kVlSavePretrained ? "model." : "";
  }

  std::vector<float> random(int64_t n, float std) {
    std::normal_distribution<float> dist(0.0f, std);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng_);
    return v;
  }

  void norm(const std::string& name, const std::string& key, int64_t n) {
    std::vector<float> v = random(n, 0.1f);
    // Alternate stored dtypes: the loader converts both to F32.
    if (++norm_count_ % 2)
      expected_[key] = w_.add_bf16(name, {n}, v);
    else
      w_.add_f32(name, {n}, v), expected_[key] = v;
  }

  void layer(int i) {
    const int64_t H = c_.hidden_size, hd = c_.head_dim;
    const std::string L = layer_prefix(i), K = "L" + std::to_string(i) + ".";
    norm(L + "input_layernorm.weight", K + "input_norm", H);
    norm(L + "post_attention_layernorm.weight", K + "post_norm", H);
    const std::string A = L + "self_attn.";
    linear(A + "q_proj", K + "q", c_.num_heads * hd, H, o_.linear);
    linear(A + "k_proj", K + "k", c_.num_kv_heads * hd, H, o_.linear);
    linear(A + "v_proj", K + "v", c_.num_kv_heads * hd, H, o_.linear);
    linear(A + "o_proj", K + "o", H, c_.num_heads * hd, o_.linear);
    norm(A + "q_norm.weight", K + "q_norm", hd);
    norm(A + "k_norm.weight", K + "k_norm", hd);
    if (c_.attention_kinds[i] == AttentionKind::kSparse) {
      const int64_t ihd = c_.index_head_dim;
      const std::string I = release() ? A + "index_" : A + "indexer.";
      linear(I + "q_proj", K + "index_q", c_.index_heads * ihd, H, o_.linear);
      linear(I + "k_proj", K + "index_k", ihd, H, o_.linear);
      norm(I + "q_norm.weight", K + "index_q_norm", ihd);
      norm(I + "k_norm.weight", K + "index_k_norm", ihd);
    }
    if (c_.mlp_kinds[i] == MlpKind::kDense) {
      const std::string D =
          release() && o_.dense_in_moe_block ? L + "block_sparse_moe." : L + "mlp.";
      gate_up(D, K, c_.dense_intermediate_size, !release() || o_.fused_dense);
      linear(D + "down_proj", K + "down", H, c_.dense_intermediate_size, o_.linear);
      return;
    }
    const std::string M = release() ? L + "block_sparse_moe." : L + "mlp.";
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size;
    std::vector<float> router = random(E * H, 0.2f);
    w_.add_f32(M + "gate.weight", {E, H}, router);
    expected_[K + "router"] = router;
    std::vector<float> bias = random(E, 0.01f);
    w_.add_f32(release() ? M + "e_score_correction_bias" : M + "gate.e_score_correction_bias", {E},
               bias);
    expected_[K + "router_bias"] = bias;
    gate_up(M + "shared_experts.", K, c_.shared_intermediate_size, !release());
    linear(M + "shared_experts.down_proj", K + "down", H, c_.shared_intermediate_size, o_.linear);
    if (release()) {
      for (int64_t e = 0; e < E; ++e) {
        const std::string X = M + "experts." + std::to_string(e) + ".";
        const std::string KE = K + "e" + std::to_string(e) + ".";
        linear(X + "w1", KE + "gate", I, H, o_.expert);
        linear(X + "w3", KE + "up", I, H, o_.expert);
        linear(X + "w2", KE + "down", H, I, o_.expert);
      }
      return;
    }
    // save_pretrained: 3-D [E, 2I, H] and [E, H, I] in the activation dtype.
    std::vector<float> gu = random(E * 2 * I * H, 0.3f), down = random(E * H * I, 0.3f);
    gu = w_.add_bf16(M + "experts.gate_up_proj", {E, 2 * I, H}, gu);
    w_.add_f32(M + "experts.down_proj", {E, H, I}, down);
    for (int64_t e = 0; e < E; ++e) {
      const std::string KE = K + "e" + std::to_string(e) + ".";
      const float* g = gu.data() + e * 2 * I * H;
      expected_[KE + "gate"].assign(g, g + I * H);
      expected_[KE + "up"].assign(g + I * H, g + 2 * I * H);
      expected_[KE + "down"].assign(down.data() + e * H * I, down.data() + (e + 1) * H * I);
    }
  }

  // gate and up (keys K+"gate", K+"up"), fused into one gate_up_proj or separate.
  void gate_up(const std::string& base, const std::string& K, int64_t width, bool fused) {
    const int64_t H = c_.hidden_size;
    if (!fused) {
      linear(base + "gate_proj", K + "gate", width, H, o_.linear);
      linear(base + "up_proj", K + "up", width, H, o_.linear);
      return;
    }
    linear(base + "gate_up_proj", K + "gate_up", 2 * width, H, o_.linear);
    std::vector<float> both = expected_[K + "gate_up"];
    expected_.erase(K + "gate_up");
    expected_[K + "gate"].assign(both.begin(), both.begin() + width * H);
    expected_[K + "up"].assign(both.begin() + width * H, both.end());
  }

  void linear(const std::string& base, const std::string& key, int64_t out, int64_t in, Fmt fmt) {
    std::vector<float> v = random(out * in, 0.5f);
    std::vector<float>& expect = expected_[key];
    expect.assign(out * in, 0.0f);
    const Shape shape{out, in};
    auto amax_of = [&] {
      float a = 0;
      for (float x : v) a = std::fmax(a, std::fabs(x));
      return a;
    };
    switch (fmt) {
      case Fmt::kBf16:
        expect = w_.add_bf16(base + ".weight", shape, v);
        return;
      case Fmt::kF32:
        w_.add_f32(base + ".weight", shape, v);
        expect = v;
        return;
      case Fmt::kMxfp8:
      case Fmt::kMxfp8Renamed: {
        const int64_t blocks = (in + 31) / 32;
        std::vector<uint8_t> codes(out * in), scales(out * blocks);
        for (int64_t r = 0; r < out; ++r)
          mxfp8_quantize_row(v.data() + r * in, in, codes.data() + r * in,
                             scales.data() + r * blocks);
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c)
            expect[r * in + c] = fp8_e4m3_decode(codes[r * in + c]) *
                                 std::ldexp(1.0f, int(scales[r * blocks + c / 32]) - 127);
        w_.add(base + ".weight", DType::kF8E4M3, shape, codes);
        w_.add(base + (fmt == Fmt::kMxfp8 ? ".weight_scale_inv" : ".weight_scale"), DType::kU8,
               {out, blocks}, scales);
        return;
      }
      case Fmt::kFp8Tensor: {
        const float scale = amax_of() / 448.0f;
        std::vector<uint8_t> codes(out * in);
        for (int64_t i = 0; i < out * in; ++i) {
          codes[i] = fp8_e4m3_encode(v[i] / scale);
          expect[i] = fp8_e4m3_decode(codes[i]) * scale;
        }
        w_.add(base + ".weight", DType::kF8E4M3, shape, codes);
        w_.add_f32(base + ".weight_scale", {1}, {scale});
        w_.add_f32(base + ".input_scale", {}, {0.25f});
        return;
      }
      case Fmt::kFp8Block: {
        const int64_t br = (out + 127) / 128, bc = (in + 127) / 128;
        std::vector<float> scales(br * bc, 0.0f);
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c) {
            float& s = scales[(r / 128) * bc + c / 128];
            s = std::fmax(s, std::fabs(v[r * in + c]) / 448.0f);
          }
        std::vector<uint8_t> codes(out * in);
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c) {
            const float s = scales[(r / 128) * bc + c / 128];
            codes[r * in + c] = fp8_e4m3_encode(v[r * in + c] / s);
            expect[r * in + c] = fp8_e4m3_decode(codes[r * in + c]) * s;
          }
        w_.add(base + ".weight", DType::kF8E4M3, shape, codes);
        w_.add_f32(base + ".weight_scale_inv", {br, bc}, scales);
        return;
      }
      case Fmt::kNvfp4Ct:
      case Fmt::kNvfp4ModelOpt: {
        const int64_t packed_cols = (in + 1) / 2, groups = (in + 15) / 16;
        // Second-level scale as NVIDIA's tools choose it: the tensor's amax maps to 448 * 6.
        const float global = 448.0f * 6.0f / amax_of();  // compressed-tensors stores this divisor
        const float scale_2 = 1.0f / global;             // ModelOpt stores a multiplier
        std::vector<uint8_t> packed(out * packed_cols), scales(out * groups);
        for (int64_t r = 0; r < out; ++r)
          nvfp4_quantize_row(v.data() + r * in, in, fmt == Fmt::kNvfp4Ct ? global : 1.0f / scale_2,
                             packed.data() + r * packed_cols, scales.data() + r * groups);
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c) {
            const uint8_t byte = packed[r * packed_cols + c / 2];
            const uint8_t code = c % 2 ? byte >> 4 : byte & 15;
            const float first = e2m1_decode(code) * fp8_e4m3_decode(scales[r * groups + c / 16]);
            expect[r * in + c] = fmt == Fmt::kNvfp4Ct ? first / global : first * scale_2;
          }
        if (fmt == Fmt::kNvfp4Ct) {
          w_.add(base + ".weight_packed", DType::kU8, {out, packed_cols}, packed);
          w_.add(base + ".weight_scale", DType::kF8E4M3, {out, groups}, scales);
          w_.add_f32(base + ".weight_global_scale", {1}, {global});
        } else {
          w_.add(base + ".weight", DType::kU8, {out, packed_cols}, packed);
          w_.add(base + ".weight_scale", DType::kF8E4M3, {out, groups}, scales);
          w_.add_f32(base + ".weight_scale_2", {}, {scale_2});
          w_.add_f32(base + ".input_scale", {1}, {0.5f});
        }
        return;
      }
    }
  }

  const ModelConfig& c_;
  BuildOptions o_;
  std::mt19937_64 rng_;
  SafetensorsWriter w_;
  Expected expected_;
  int norm_count_ = 0;
};

}  // namespace m3::testing
