#include "model/weight_footprint.h"

#include <string>

#include "core/error.h"

namespace m3 {

ModelGeometry model_geometry(const ModelConfig& c) {
  ModelGeometry g;
  g.num_heads = c.num_heads;
  g.num_kv_heads = c.num_kv_heads;
  g.head_dim = c.head_dim;
  g.index_heads = c.has_sparse_layers() ? c.index_heads : 0;
  const bool moe = c.num_moe_layers() > 0;
  g.num_experts = moe ? c.num_experts : 0;
  g.moe_intermediate_size = moe ? c.moe_intermediate_size : 0;
  g.shared_intermediate_size = moe ? c.shared_intermediate_size : 0;
  g.dense_intermediate_size = c.num_moe_layers() < c.num_layers ? c.dense_intermediate_size : 0;
  g.vocab_size = c.vocab_size;
  return g;
}

WeightFormat declared_weight_format(const ModelConfig& c, const std::string& name, QuantScheme declared) {
  if (c.quant.is_ignored(name)) return WeightFormat::kDense;
  switch (declared) {
    case QuantScheme::kNone: return WeightFormat::kDense;
    case QuantScheme::kFp8: return WeightFormat::kFp8;
    case QuantScheme::kFp8Block: return WeightFormat::kFp8Block;
    case QuantScheme::kMxfp8: return WeightFormat::kMxfp8;
    case QuantScheme::kNvfp4: return WeightFormat::kNvfp4;
  }
  return WeightFormat::kDense;
}

namespace {

// Columns per scale along the input dimension, rows per scale along the output (1: no blocks).
int64_t scale_block_cols(WeightFormat f) {
  switch (f) {
    case WeightFormat::kMxfp8: return 32;
    case WeightFormat::kNvfp4: return 16;
    case WeightFormat::kFp8Block: return 128;
    default: return 1;
  }
}

// A rank's slice of a quantized linear must hold whole scale blocks: a block cut between two
// ranks would need its scale on both and every kernel to start mid-block.
void check_whole_blocks(const std::string& name, WeightFormat f, int64_t out, int64_t full_out, int64_t in,
                        int64_t full_in) {
  const int64_t cols = scale_block_cols(f);
  M3_CHECK(in == full_in || in % cols == 0,
           "{}: a rank holds {} of its {} input columns, which cuts its {} scale blocks of {} columns; choose a -tp "
           "that keeps them whole",
           name, in, full_in, weight_format_name(f), cols);
  M3_CHECK(f != WeightFormat::kFp8Block || out == full_out || out % 128 == 0,
           "{}: a rank holds {} of its {} output rows, which cuts its fp8-block128 scale blocks of 128 rows; choose "
           "a -tp that keeps them whole",
           name, out, full_out);
}

}  // namespace

WeightFootprint weight_footprint(const ModelConfig& c, const RankShard& s) {
  constexpr int64_t kF32 = 4;
  const int64_t H = c.hidden_size, hd = c.head_dim, ihd = c.index_head_dim;
  const QuantScheme lin = c.quant.linear_scheme;
  // One linear under its release-layout name (the name decides ignore-list membership), full
  // [full_out, full_in], of which the rank holds [out, in].
  const auto sliced = [&](const std::string& name, int64_t out, int64_t full_out, int64_t in, int64_t full_in,
                          QuantScheme scheme) {
    const WeightFormat f = declared_weight_format(c, name, scheme);
    check_whole_blocks(name, f, out, full_out, in, full_in);
    return linear_weight_bytes(f, out, in);
  };
  // Linears every rank holds whole (lm_head is cut by rows of the padded vocabulary, dense).
  const auto linear = [&](const std::string& name, int64_t out, int64_t in, QuantScheme scheme) {
    return linear_weight_bytes(declared_weight_format(c, name, scheme), out, in);
  };
  WeightFootprint f;
  // Embedding rows are bf16 (the dummy weights and the release files); a rank holds its padded
  // vocabulary slice. A tied lm_head is the embedding itself.
  f.embedding = s.vocab.size * H * 2 + kF32 * H;
  if (!c.tie_word_embeddings) f.embedding += linear("lm_head", s.vocab.size, H, QuantScheme::kNone);

  const int64_t q_rows = s.q_heads.size * hd, kv_rows = s.kv_heads.size * hd;
  const int64_t Q = int64_t(c.num_heads) * hd, KV = int64_t(c.num_kv_heads) * hd;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string L = "language_model.model.layers." + std::to_string(i) + ".";
    const std::string A = L + "self_attn.";
    f.attention += 2 * kF32 * H + 2 * kF32 * hd;  // input/post-attention norms, q/k norms
    f.attention += sliced(A + "q_proj", q_rows, Q, H, H, lin) + sliced(A + "k_proj", kv_rows, KV, H, H, lin) +
                   sliced(A + "v_proj", kv_rows, KV, H, H, lin) + sliced(A + "o_proj", H, H, q_rows, Q, lin);
    if (c.attention_kinds[i] == AttentionKind::kSparse) {
      // index_k is the one key head all index heads share: every rank holds it whole.
      f.attention += sliced(A + "index_q_proj", s.index_heads.size * ihd, int64_t(c.index_heads) * ihd, H, H, lin) +
                     linear(A + "index_k_proj", ihd, H, lin) + 2 * kF32 * ihd;
    }
    if (c.mlp_kinds[i] == MlpKind::kDense) {
      const int64_t D = s.dense_intermediate.size, FD = c.dense_intermediate_size;
      f.dense_mlp += sliced(L + "mlp.gate_proj", D, FD, H, H, lin) + sliced(L + "mlp.up_proj", D, FD, H, H, lin) +
                     sliced(L + "mlp.down_proj", H, H, D, FD, lin);
      continue;
    }
    const std::string M = L + "block_sparse_moe.";
    const int64_t S = s.shared_intermediate.size, I = s.expert_intermediate.size;
    f.shared_expert += kF32 * (int64_t(c.num_experts) * H + c.num_experts);  // router gate + bias
    const int64_t FS = c.shared_intermediate_size, FI = c.moe_intermediate_size;
    f.shared_expert += sliced(M + "shared_experts.gate_proj", S, FS, H, H, lin) +
                       sliced(M + "shared_experts.up_proj", S, FS, H, H, lin) +
                       sliced(M + "shared_experts.down_proj", H, H, S, FS, lin);
    // Ignore lists name experts per layer, never per expert: expert 0 speaks for the layer.
    const WeightFormat ef = declared_weight_format(c, M + "experts.0.w1", c.quant.expert_scheme);
    check_whole_blocks(M + "experts.0.w1", ef, I, FI, H, H);
    check_whole_blocks(M + "experts.0.w2", ef, H, H, I, FI);
    f.routed_experts += s.experts.size * (2 * linear_weight_bytes(ef, I, H) + linear_weight_bytes(ef, H, I));
  }
  return f;
}

}  // namespace m3
