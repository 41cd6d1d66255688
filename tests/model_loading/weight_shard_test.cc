// Slicing weights for tensor / expert parallel: LinearWeight::columns / rows / padded_rows give,
// in every format, exactly the dequantized slice of the full matrix (scale grids enforced); and
// shard_weights gives each rank of a layout the slices parallel/layout.h assigns it, which put
// back together are the full model, weigh what weight_footprint says, and are views where no
// copy is needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/rows.h"
#include "model/config.h"
#include "model/weight_footprint.h"
#include "model/weight_shard.h"
#include "model/weights.h"
#include "parallel/layout.h"
#include "tests/model_loading/small_config.h"

namespace m3 {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using Matrix = std::vector<float>;  // row-major [out, in]

Matrix dequant(const LinearWeight& w) {
  Matrix m(static_cast<std::size_t>(w.out_features * w.in_features));
  if (w.out_features > 0) dequantize_rows(w, 0, w.out_features, m.data());
  return m;
}

Matrix row_range(const Matrix& m, int64_t in, int64_t begin, int64_t end) {
  return Matrix(m.begin() + begin * in, m.begin() + end * in);
}

Matrix column_range(const Matrix& m, int64_t out, int64_t in, int64_t begin, int64_t end) {
  Matrix r;
  for (int64_t i = 0; i < out; ++i) r.insert(r.end(), m.begin() + i * in + begin, m.begin() + i * in + end);
  return r;
}

Matrix concat_rows(const std::vector<Matrix>& parts) {
  Matrix r;
  for (const Matrix& p : parts) r.insert(r.end(), p.begin(), p.end());
  return r;
}

Matrix concat_columns(const std::vector<Matrix>& parts, int64_t out) {
  Matrix r;
  for (int64_t i = 0; i < out; ++i)
    for (const Matrix& p : parts) {
      const int64_t width = static_cast<int64_t>(p.size()) / out;
      r.insert(r.end(), p.begin() + i * width, p.begin() + (i + 1) * width);
    }
  return r;
}

// ---------------------------------------------------------------------------------------------
// LinearWeight slices, one random [260, 301] weight per format: neither size is a multiple of
// any block, so every format's last block along each dimension is partial.

constexpr int64_t kOut = 260, kIn = 301;

struct FormatCase {
  const char* label;
  WeightFormat format;
  DType dense_dtype = DType::kBF16;
  bool divisor = false;  // kNvfp4: compressed-tensors (global_divisor) rather than ModelOpt
  int64_t block = 1;     // scale grid along the input
};

Tensor random_bytes(Shape shape, DType dtype, std::mt19937& rng, uint8_t low, uint8_t high) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  std::uniform_int_distribution<int> pick(low, high);
  for (uint8_t& b : std::span(t.data_as<uint8_t>(), t.nbytes())) b = static_cast<uint8_t>(pick(rng));
  return t;
}

// E4M3 codes without the two NaNs (0x7f, 0xff).
Tensor random_fp8(Shape shape, std::mt19937& rng) {
  Tensor t = random_bytes(std::move(shape), DType::kF8E4M3, rng, 0, 255);
  for (uint8_t& b : std::span(t.data_as<uint8_t>(), t.nbytes()))
    if ((b & 0x7f) == 0x7f) b ^= 1;
  return t;
}

LinearWeight random_linear(const FormatCase& k) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  LinearWeight w;
  w.name = "test.w";
  w.out_features = kOut;
  w.in_features = kIn;
  w.format = k.format;
  switch (k.format) {
    case WeightFormat::kDense: {
      w.weight = Tensor::zeros({kOut, kIn}, k.dense_dtype);
      for (int64_t i = 0; i < kOut * kIn; ++i) {
        if (k.dense_dtype == DType::kF32)
          w.weight.data_as<float>()[i] = normal(rng);
        else
          w.weight.data_as<uint16_t>()[i] = bf16_encode(normal(rng));
      }
      break;
    }
    case WeightFormat::kFp8:
      w.weight = random_fp8({kOut, kIn}, rng);
      w.scale = Tensor::zeros({1}, DType::kF32);
      w.scale.data_as<float>()[0] = 0.037f;
      w.input_scale = 0.5f;
      break;
    case WeightFormat::kFp8Block: {
      w.weight = random_fp8({kOut, kIn}, rng);
      w.scale = Tensor::zeros({(kOut + 127) / 128, (kIn + 127) / 128}, DType::kF32);
      std::uniform_real_distribution<float> scale(0.01f, 1.0f);
      for (float& s : w.scale.span<float>()) s = scale(rng);
      break;
    }
    case WeightFormat::kMxfp8:
      w.weight = random_fp8({kOut, kIn}, rng);
      w.scale = random_bytes({kOut, (kIn + 31) / 32}, DType::kU8, rng, 110, 140);
      break;
    case WeightFormat::kNvfp4:
      w.weight = random_bytes({kOut, (kIn + 1) / 2}, DType::kU8, rng, 0, 255);
      w.scale = random_bytes({kOut, (kIn + 15) / 16}, DType::kF8E4M3, rng, 0x08, 0x7e);  // positive, finite
      if (k.divisor) {
        w.global_divisor = 37.5f;
        w.global_scale = 1.0f / 37.5f;
      } else {
        w.global_scale = 0.0123f;
      }
      w.input_scale = 0.25f;
      break;
  }
  return w;
}

int dense_bytes(const FormatCase& k) { return static_cast<int>(dtype_size(k.dense_dtype)); }

class LinearSlices : public ::testing::TestWithParam<FormatCase> {};

TEST_P(LinearSlices, ColumnsAreTheSliceOfTheFullMatrixInTheSameFormat) {
  const FormatCase& k = GetParam();
  const LinearWeight w = random_linear(k);
  const Matrix full = dequant(w);
  const int64_t g = k.block == 1 ? 7 : k.block;  // formats without a grid: any bounds
  const int64_t last = (kIn - 1) / g * g;
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {0, g}, {g, std::min(3 * g, kIn)}, {last, kIn}, {0, kIn}, {2 * g, 2 * g}}) {
    SCOPED_TRACE(::testing::Message() << "columns [" << begin << ", " << end << ")");
    const LinearWeight c = w.columns(begin, end);
    EXPECT_EQ(c.format, w.format);
    EXPECT_EQ(c.name, w.name);
    EXPECT_EQ(c.out_features, kOut);
    EXPECT_EQ(c.in_features, end - begin);
    EXPECT_EQ(c.global_scale, w.global_scale);
    EXPECT_EQ(c.global_divisor, w.global_divisor);
    EXPECT_EQ(c.input_scale, w.input_scale);
    EXPECT_NE(c.weight.data(), w.weight.data());  // an owning copy
    EXPECT_EQ(static_cast<int64_t>(c.nbytes()), linear_weight_bytes(k.format, kOut, end - begin, dense_bytes(k)));
    EXPECT_EQ(dequant(c), column_range(full, kOut, kIn, begin, end));
  }
}

TEST_P(LinearSlices, RowsAndRowsThenColumnsAreSlicesToo) {
  const FormatCase& k = GetParam();
  const LinearWeight w = random_linear(k);
  const Matrix full = dequant(w);
  const bool row_blocks = k.format == WeightFormat::kFp8Block;
  const std::vector<std::pair<int64_t, int64_t>> ranges =
      row_blocks ? std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {128, kOut}, {256, kOut}}
                 : std::vector<std::pair<int64_t, int64_t>>{{3, 77}, {kOut - 1, kOut}, {0, kOut}};
  for (const auto& [begin, end] : ranges) {
    SCOPED_TRACE(::testing::Message() << "rows [" << begin << ", " << end << ")");
    const LinearWeight r = w.rows(begin, end);
    EXPECT_EQ(dequant(r), row_range(full, kIn, begin, end));
    const int64_t g = k.block == 1 ? 5 : k.block, g_end = std::min(3 * g, kIn);
    const LinearWeight rc = r.columns(g, g_end);
    EXPECT_EQ(dequant(rc), column_range(row_range(full, kIn, begin, end), end - begin, kIn, g, g_end));
  }
}

TEST_P(LinearSlices, PaddedRowsAreZero) {
  const FormatCase& k = GetParam();
  const LinearWeight w = random_linear(k);
  EXPECT_EQ(w.padded_rows(kOut).weight.data(), w.weight.data());  // nothing to add: the same memory
  const LinearWeight p = w.padded_rows(400);
  EXPECT_EQ(p.out_features, 400);
  EXPECT_EQ(p.format, w.format);
  EXPECT_EQ(static_cast<int64_t>(p.nbytes()), linear_weight_bytes(k.format, 400, kIn, dense_bytes(k)));
  Matrix expected = dequant(w);
  expected.resize(400 * kIn, 0.0f);
  EXPECT_EQ(dequant(p), expected);
  // Padding a row slice (a rank's end of the vocabulary) pads after the slice.
  const int64_t begin = k.format == WeightFormat::kFp8Block ? 256 : 250;
  Matrix tail = row_range(dequant(w), kIn, begin, kOut);
  tail.resize((kOut - begin + 3) * kIn, 0.0f);
  EXPECT_EQ(dequant(w.rows(begin, kOut).padded_rows(kOut - begin + 3)), tail);
  EXPECT_THROW(w.padded_rows(kOut - 1), Error);
}

TEST_P(LinearSlices, BoundsOffTheScaleGridAreErrors) {
  const FormatCase& k = GetParam();
  const LinearWeight w = random_linear(k);
  EXPECT_THROW(w.columns(0, kIn + 1), Error);
  EXPECT_THROW(w.columns(5, 4), Error);
  if (k.block == 1) {
    EXPECT_NO_THROW(w.columns(3, 5));
    return;
  }
  const int64_t off = k.block / 2;
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{off, k.block}, {0, k.block + off}}) {
    try {
      w.columns(begin, end);
      ADD_FAILURE() << "columns [" << begin << ", " << end << ") cut a scale block";
    } catch (const Error& e) {
      const int64_t bound = begin == off ? begin : end;
      EXPECT_EQ(std::string(e.what()),
                "test.w: column bound " + std::to_string(bound) + " of [" + std::to_string(begin) + ", " +
                    std::to_string(end) + ") cuts a " + std::string(weight_format_name(k.format)) + " scale block of " +
                    std::to_string(k.block) + " columns (bounds must be multiples of " + std::to_string(k.block) +
                    " or in_features 301)");
    }
  }
  if (k.format == WeightFormat::kFp8Block) {
    try {
      w.rows(64, 128);
      ADD_FAILURE() << "rows [64, 128) cut a 128-row block";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("test.w: rows [64, 128) split a 128-row fp8 scale block"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, LinearSlices,
    ::testing::Values(FormatCase{"dense_f32", WeightFormat::kDense, DType::kF32},
                      FormatCase{"dense_bf16", WeightFormat::kDense, DType::kBF16},
                      FormatCase{"fp8", WeightFormat::kFp8},
                      FormatCase{"fp8_block", WeightFormat::kFp8Block, DType::kBF16, false, 128},
                      FormatCase{"mxfp8", WeightFormat::kMxfp8, DType::kBF16, false, 32},
                      FormatCase{"nvfp4_modelopt", WeightFormat::kNvfp4, DType::kBF16, false, 16},
                      FormatCase{"nvfp4_compressed_tensors", WeightFormat::kNvfp4, DType::kBF16, true, 16}),
    [](const auto& info) { return std::string(info.param.label); });

// ---------------------------------------------------------------------------------------------
// shard_weights on a three-layer model (dense full-attention, then two sparse MoE layers) whose
// sizes split over 1, 2 and 4 ranks in every format, fp8's 128x128 blocks included: heads of
// 128, intermediates of 512, 8 query heads in 2 KV groups (replicated at -tp 4) with an index
// head each, 4 experts, and a vocabulary of 1001 that neither 2 nor 4 divides
// (testing::shard_test_config).

ModelConfig shard_config(const json& quant, int vocab = 1001) { return testing::shard_test_config(quant, vocab); }

LinearWeight table(const Tensor& t) {
  LinearWeight w;
  w.name = "embed_tokens";
  w.out_features = t.dim(0);
  w.in_features = t.dim(1);
  w.weight = t;
  return w;
}

int64_t bytes(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
int64_t bytes(const LinearWeight& w) { return w.defined() ? static_cast<int64_t>(w.nbytes()) : 0; }

// Every tensor a rank's weights hold (a tied head is the embedding's buffer, counted once).
int64_t held_bytes(const ModelWeights& w) {
  int64_t n = bytes(w.embed) + bytes(w.final_norm);
  if (w.lm_head.weight.data() != w.embed.data()) n += bytes(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    const AttentionWeights& a = l.attn;
    n += bytes(l.input_norm) + bytes(l.post_attn_norm) + bytes(a.q_norm) + bytes(a.k_norm) + bytes(a.index_q_norm) +
         bytes(a.index_k_norm);
    for (const LinearWeight* x : {&a.q, &a.k, &a.v, &a.o, &a.index_q, &a.index_k, &l.mlp.gate, &l.mlp.up, &l.mlp.down})
      n += bytes(*x);
    n += bytes(l.mlp.router) + bytes(l.mlp.router_bias);
    for (const ExpertWeights& e : l.mlp.experts) n += bytes(e.gate) + bytes(e.up) + bytes(e.down);
  }
  return n;
}

// `part` is rows [begin, end) of `whole`: a view of its memory, dequantizing to those rows.
void expect_rows(const LinearWeight& part, const LinearWeight& whole, int64_t begin, int64_t end) {
  SCOPED_TRACE(::testing::Message() << whole.name << " rows [" << begin << ", " << end << ")");
  ASSERT_EQ(part.out_features, end - begin);
  ASSERT_EQ(part.in_features, whole.in_features);
  EXPECT_EQ(part.weight.data(), whole.rows(begin, end).weight.data());
  EXPECT_EQ(dequant(part), row_range(dequant(whole), whole.in_features, begin, end));
}

// `part` is columns [begin, end) of `whole`: a copy unless it is all of them.
void expect_columns(const LinearWeight& part, const LinearWeight& whole, int64_t begin, int64_t end) {
  SCOPED_TRACE(::testing::Message() << whole.name << " columns [" << begin << ", " << end << ")");
  ASSERT_EQ(part.out_features, whole.out_features);
  ASSERT_EQ(part.in_features, end - begin);
  if (end - begin == whole.in_features)
    EXPECT_EQ(part.weight.data(), whole.weight.data());
  else
    EXPECT_NE(part.weight.data(), whole.weight.data());
  EXPECT_EQ(dequant(part), column_range(dequant(whole), whole.out_features, whole.in_features, begin, end));
}

// The rows `vocab` of the padded vocabulary of a full [vocab_size, hidden] table.
Matrix padded_vocab_rows(const LinearWeight& whole, Slice vocab) {
  const int64_t v = whole.out_features, in = whole.in_features;
  Matrix m = row_range(dequant(whole), in, std::min(vocab.begin, v), std::min(vocab.end(), v));
  m.resize(vocab.size * in, 0.0f);
  return m;
}

// What parallel/layout.h says `s` holds, tensor by tensor, against the full weights.
void expect_rank_slices(const ModelWeights& full, const ModelWeights& part, const ModelConfig& c,
                        const RankShard& s) {
  SCOPED_TRACE(::testing::Message() << "rank " << s.rank);
  EXPECT_EQ(part.embed.shape(), (Shape{s.vocab.size, c.hidden_size}));
  EXPECT_EQ(dequant(table(part.embed)), padded_vocab_rows(table(full.embed), s.vocab));
  EXPECT_EQ(dequant(part.lm_head), padded_vocab_rows(full.lm_head, s.vocab));
  EXPECT_EQ(part.final_norm.data(), full.final_norm.data());
  EXPECT_EQ(part.keep_alive, full.keep_alive);
  const int64_t hd = c.head_dim, ihd = c.index_head_dim;
  for (int i = 0; i < c.num_layers; ++i) {
    SCOPED_TRACE(::testing::Message() << "layer " << i);
    const LayerWeights &f = full.layers[i], &p = part.layers[i];
    EXPECT_EQ(p.input_norm.data(), f.input_norm.data());
    EXPECT_EQ(p.post_attn_norm.data(), f.post_attn_norm.data());
    EXPECT_EQ(p.attn.q_norm.data(), f.attn.q_norm.data());
    EXPECT_EQ(p.attn.k_norm.data(), f.attn.k_norm.data());
    expect_rows(p.attn.q, f.attn.q, s.q_heads.begin * hd, s.q_heads.end() * hd);
    expect_rows(p.attn.k, f.attn.k, s.kv_heads.begin * hd, s.kv_heads.end() * hd);
    expect_rows(p.attn.v, f.attn.v, s.kv_heads.begin * hd, s.kv_heads.end() * hd);
    expect_columns(p.attn.o, f.attn.o, s.q_heads.begin * hd, s.q_heads.end() * hd);
    if (c.attention_kinds[i] == AttentionKind::kSparse) {
      expect_rows(p.attn.index_q, f.attn.index_q, s.index_heads.begin * ihd, s.index_heads.end() * ihd);
      EXPECT_EQ(p.attn.index_k.weight.data(), f.attn.index_k.weight.data());
      EXPECT_EQ(p.attn.index_k.out_features, ihd);
      EXPECT_EQ(p.attn.index_q_norm.data(), f.attn.index_q_norm.data());
      EXPECT_EQ(p.attn.index_k_norm.data(), f.attn.index_k_norm.data());
    }
    const MlpWeights &fm = f.mlp, &pm = p.mlp;
    const Slice mid = c.mlp_kinds[i] == MlpKind::kDense ? s.dense_intermediate : s.shared_intermediate;
    expect_rows(pm.gate, fm.gate, mid.begin, mid.end());
    expect_rows(pm.up, fm.up, mid.begin, mid.end());
    expect_columns(pm.down, fm.down, mid.begin, mid.end());
    if (c.mlp_kinds[i] == MlpKind::kDense) {
      EXPECT_TRUE(pm.experts.empty());
      continue;
    }
    EXPECT_EQ(pm.router.data(), fm.router.data());
    EXPECT_EQ(pm.router_bias.data(), fm.router_bias.data());
    ASSERT_EQ(static_cast<int64_t>(pm.experts.size()), s.experts.size);
    const Slice w = s.expert_intermediate;
    for (int64_t j = 0; j < s.experts.size; ++j) {
      const ExpertWeights &pe = pm.experts[j], &fe = fm.experts[s.experts.begin + j];
      expect_rows(pe.gate, fe.gate, w.begin, w.end());
      expect_rows(pe.up, fe.up, w.begin, w.end());
      expect_columns(pe.down, fe.down, w.begin, w.end());
    }
  }
}

// The tp ranks of each data-parallel copy put back together give the full tensors: query rows,
// o columns, intermediates, each routed expert (without expert parallel) and the vocabulary; with
// expert parallel the experts of all ranks, in rank order, are the layer's experts.
void expect_ranks_reassemble(const ModelWeights& full, const std::vector<ModelWeights>& parts,
                             const ParallelLayout& layout, const ModelConfig& c) {
  const int tp = layout.config.tensor_parallel_size;
  for (int copy = 0; copy < layout.config.data_parallel_size; ++copy) {
    SCOPED_TRACE(::testing::Message() << "copy " << copy);
    auto ranks = [&](auto&& get) {
      std::vector<Matrix> m;
      for (int r = copy * tp; r < (copy + 1) * tp; ++r) m.push_back(get(parts[r]));
      return m;
    };
    Matrix embed = dequant(table(full.embed));
    embed.resize(layout.padded_vocab_size * c.hidden_size, 0.0f);  // the padded rows are zero
    EXPECT_EQ(concat_rows(ranks([](const ModelWeights& w) { return dequant(table(w.embed)); })), embed);
    Matrix head = dequant(full.lm_head);
    head.resize(layout.padded_vocab_size * c.hidden_size, 0.0f);
    EXPECT_EQ(concat_rows(ranks([](const ModelWeights& w) { return dequant(w.lm_head); })), head);
    for (int i = 0; i < c.num_layers; ++i) {
      SCOPED_TRACE(::testing::Message() << "layer " << i);
      const LayerWeights& f = full.layers[i];
      EXPECT_EQ(concat_rows(ranks([&](const ModelWeights& w) { return dequant(w.layers[i].attn.q); })),
                dequant(f.attn.q));
      EXPECT_EQ(concat_columns(ranks([&](const ModelWeights& w) { return dequant(w.layers[i].attn.o); }),
                               c.hidden_size),
                dequant(f.attn.o));
      EXPECT_EQ(concat_rows(ranks([&](const ModelWeights& w) { return dequant(w.layers[i].mlp.gate); })),
                dequant(f.mlp.gate));
      EXPECT_EQ(concat_columns(ranks([&](const ModelWeights& w) { return dequant(w.layers[i].mlp.down); }),
                               c.hidden_size),
                dequant(f.mlp.down));
      if (c.mlp_kinds[i] == MlpKind::kDense || layout.expert_parallel_size > 1) continue;
      for (int e = 0; e < c.num_experts; ++e) {
        EXPECT_EQ(concat_rows(ranks([&](const ModelWeights& w) { return dequant(w.layers[i].mlp.experts[e].up); })),
                  dequant(f.mlp.experts[e].up));
        EXPECT_EQ(concat_columns(
                      ranks([&](const ModelWeights& w) { return dequant(w.layers[i].mlp.experts[e].down); }),
                      c.hidden_size),
                  dequant(f.mlp.experts[e].down));
      }
    }
  }
  if (layout.expert_parallel_size == 1) return;
  for (int i = 0; i < c.num_layers; ++i) {
    if (c.mlp_kinds[i] == MlpKind::kDense) continue;
    std::vector<const ExpertWeights*> all;
    for (const ModelWeights& w : parts)
      for (const ExpertWeights& e : w.layers[i].mlp.experts) all.push_back(&e);
    ASSERT_EQ(static_cast<int>(all.size()), c.num_experts);
    for (int e = 0; e < c.num_experts; ++e) {
      const ExpertWeights& f = full.layers[i].mlp.experts[e];
      // Whole experts are views: not a byte copied.
      EXPECT_EQ(all[e]->gate.weight.data(), f.gate.weight.data());
      EXPECT_EQ(all[e]->up.weight.data(), f.up.weight.data());
      EXPECT_EQ(all[e]->down.weight.data(), f.down.weight.data());
      EXPECT_EQ(all[e]->down.scale.data(), f.down.scale.data());
    }
  }
}

struct QuantCase {
  const char* label;
  json quant;
};

struct LayoutCase {
  const char* label;
  ParallelConfig parallel;
};

class ShardedModel : public ::testing::TestWithParam<std::tuple<QuantCase, LayoutCase>> {};

TEST_P(ShardedModel, RanksHoldTheirSlicesWhichReassembleAndWeighTheirFootprint) {
  const auto& [quant, parallel] = GetParam();
  const ModelConfig c = shard_config(quant.quant);
  const ModelWeights full = make_dummy_weights(c, 7);
  const ParallelLayout layout = make_parallel_layout(parallel.parallel, model_geometry(c));
  std::vector<ModelWeights> parts;
  for (const RankShard& s : layout.ranks) parts.push_back(shard_weights(full, c, s));
  for (const RankShard& s : layout.ranks) {
    EXPECT_EQ(held_bytes(parts[s.rank]), weight_footprint(c, s).total()) << "rank " << s.rank;
    expect_rank_slices(full, parts[s.rank], c, s);
  }
  expect_ranks_reassemble(full, parts, layout, c);
}

INSTANTIATE_TEST_SUITE_P(
    FormatsAndLayouts, ShardedModel,
    ::testing::Combine(
        ::testing::Values(QuantCase{"bf16", nullptr},
                          QuantCase{"m31_mxfp8_nvfp4",
                                    {{"quant_method", "mxfp8"},
                                     {"moe_quant_algo", "NVFP4"},
                                     {"moe_quant_format", "nvfp4-pack-quantized"}}},
                          QuantCase{"m31_with_ignore_list",
                                    {{"quant_method", "mxfp8"},
                                     {"moe_quant_algo", "NVFP4"},
                                     {"moe_quant_format", "nvfp4-pack-quantized"},
                                     {"ignored_layers",
                                      {"lm_head", "re:.*self_attn\\.o_proj$", "re:.*shared_experts.*"}}}},
                          QuantCase{"modelopt_nvfp4", {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}},
                          QuantCase{"fp8", {{"quant_method", "fp8"}}},
                          QuantCase{"fp8_block", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}),
        ::testing::Values(LayoutCase{"tp1", {1, 1, false}}, LayoutCase{"tp2", {2, 1, false}},
                          LayoutCase{"tp4", {4, 1, false}}, LayoutCase{"tp2_ep2", {2, 1, true}},
                          LayoutCase{"dp2_ep2", {1, 2, true}}, LayoutCase{"tp4_ep4", {4, 1, true}},
                          LayoutCase{"tp2_dp2_ep4", {2, 2, true}}, LayoutCase{"dp4_ep4", {1, 4, true}})),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).label) + "_" + std::get<1>(info.param).label;
    });

// On the small test model (heads of 64, intermediates of 96, 64 and 200, vocabulary 96) most
// layouts cut some scale block in some format: the footprint refuses a layout exactly when
// shard_weights refuses it for some rank, and otherwise they agree on every rank's bytes.
TEST(ShardWeights, FootprintRefusesWhatShardingRefuses) {
  const std::vector<json> quants = {
      nullptr,
      {{"quant_method", "mxfp8"}},
      {{"quant_method", "mxfp8"}, {"moe_quant_algo", "NVFP4"}, {"moe_quant_format", "nvfp4-pack-quantized"},
       {"ignored_layers", {"lm_head", "model.embed_tokens", "re:.*self_attn\\.o_proj$"}}},
      {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}},
      {{"quant_method", "fp8"}},
      {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}};
  const std::vector<ParallelConfig> layouts = {{1, 1, false}, {2, 1, false}, {4, 1, false}, {2, 1, true},
                                               {1, 2, true},  {4, 1, true},  {2, 2, true}};
  int accepted = 0, refused = 0;
  for (const json& quant : quants) {
    for (const int dense : {200, 256}) {
      ModelConfig c = testing::small_quantized_config(quant);
      c.dense_intermediate_size = dense;
      const ModelWeights full = make_dummy_weights(c, 2);
      for (const ParallelConfig& p : layouts) {
        SCOPED_TRACE(::testing::Message() << quant.dump() << " dense " << dense << " -tp " << p.tensor_parallel_size
                                          << " dp " << p.data_parallel_size << " ep " << p.enable_expert_parallel);
        const ParallelLayout layout = make_parallel_layout(p, model_geometry(c));
        bool footprint_refuses = false, shard_refuses = false;
        std::vector<int64_t> footprint, held;
        for (const RankShard& s : layout.ranks) {
          try {
            footprint.push_back(weight_footprint(c, s).total());
          } catch (const Error&) {
            footprint_refuses = true;
          }
          try {
            held.push_back(held_bytes(shard_weights(full, c, s)));
          } catch (const Error&) {
            shard_refuses = true;
          }
        }
        EXPECT_EQ(footprint_refuses, shard_refuses);
        if (footprint_refuses || shard_refuses) {
          ++refused;
          continue;
        }
        ++accepted;
        EXPECT_EQ(footprint, held);
      }
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(refused, 20);
}

// Every tensor of a one-rank shard is the full weights' own memory.
TEST(ShardWeights, OneRankIsTheFullWeights) {
  const ModelConfig c = shard_config({{"quant_method", "mxfp8"}});
  const ModelWeights full = make_dummy_weights(c, 3);
  const ModelWeights one = shard_weights(full, c, make_parallel_layout({}, model_geometry(c)).ranks[0]);
  EXPECT_EQ(one.embed.data(), full.embed.data());
  EXPECT_EQ(one.embed.shape(), full.embed.shape());
  EXPECT_EQ(one.lm_head.weight.data(), full.lm_head.weight.data());
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights &o = one.layers[i], &f = full.layers[i];
    const std::vector<std::pair<const LinearWeight*, const LinearWeight*>> pairs = {
        {&o.attn.q, &f.attn.q},   {&o.attn.k, &f.attn.k},       {&o.attn.v, &f.attn.v},
        {&o.attn.o, &f.attn.o},   {&o.attn.index_q, &f.attn.index_q}, {&o.mlp.gate, &f.mlp.gate},
        {&o.mlp.up, &f.mlp.up},   {&o.mlp.down, &f.mlp.down}};
    for (const auto& [a, b] : pairs) {
      EXPECT_EQ(a->weight.data(), b->weight.data()) << b->name;
      EXPECT_EQ(a->scale.data(), b->scale.data()) << b->name;
      EXPECT_EQ(a->out_features, b->out_features) << b->name;
      EXPECT_EQ(a->in_features, b->in_features) << b->name;
    }
    ASSERT_EQ(o.mlp.experts.size(), f.mlp.experts.size());
    for (std::size_t e = 0; e < f.mlp.experts.size(); ++e)
      EXPECT_EQ(o.mlp.experts[e].down.weight.data(), f.mlp.experts[e].down.weight.data());
  }
}

// A tied head stays the embedding's buffer on every rank, padded rows and all.
TEST(ShardWeights, TiedHeadSharesTheEmbeddingRows) {
  ModelConfig c = shard_config(nullptr);
  c.tie_word_embeddings = true;
  const ModelWeights full = make_dummy_weights(c, 5);
  const ParallelLayout layout = make_parallel_layout({4, 1, false}, model_geometry(c));
  ASSERT_EQ(layout.padded_vocab_size, 1004);
  for (const RankShard& s : layout.ranks) {
    const ModelWeights w = shard_weights(full, c, s);
    EXPECT_EQ(w.lm_head.weight.data(), w.embed.data());
    EXPECT_EQ(w.lm_head.out_features, 251);
    EXPECT_EQ(held_bytes(w), weight_footprint(c, s).total());
    EXPECT_EQ(dequant(w.lm_head), padded_vocab_rows(table(full.embed), s.vocab));
  }
}

// 1001 rows over 4 ranks: 251 each of the 1004 padded rows; the last rank holds 248 real rows
// (a copy, padded) and the others views of the table.
TEST(ShardWeights, VocabularyThatTpDoesNotDivide) {
  const ModelConfig c = shard_config(nullptr);
  const ModelWeights full = make_dummy_weights(c, 9);
  const ParallelLayout layout = make_parallel_layout({4, 1, false}, model_geometry(c));
  for (const RankShard& s : layout.ranks) {
    const ModelWeights w = shard_weights(full, c, s);
    ASSERT_EQ(w.embed.dim(0), 251);
    const bool padded = s.tp_rank == 3;
    EXPECT_EQ(w.embed.data() == full.embed.rows(s.vocab.begin, s.vocab.begin).data(), !padded);
    const Matrix rows = dequant(table(w.embed));
    const int64_t real = padded ? 1001 - 753 : 251;
    for (int64_t i = real * c.hidden_size; i < 251 * c.hidden_size; ++i) ASSERT_EQ(rows[i], 0.0f);
    EXPECT_EQ(Matrix(rows.begin(), rows.begin() + real * c.hidden_size),
              row_range(dequant(table(full.embed)), c.hidden_size, s.vocab.begin, s.vocab.begin + real));
  }
}

// A vocabulary of 5 over 4 ranks pads to 8: the last rank's two rows are padding only.
TEST(ShardWeights, RankOfPaddingOnly) {
  const ModelConfig c = shard_config(nullptr, 5);
  const ModelWeights full = make_dummy_weights(c, 9);
  const ParallelLayout layout = make_parallel_layout({4, 1, false}, model_geometry(c));
  const ModelWeights last = shard_weights(full, c, layout.ranks[3]);
  EXPECT_EQ(dequant(last.lm_head), Matrix(2 * c.hidden_size, 0.0f));
  EXPECT_EQ(dequant(table(last.embed)), Matrix(2 * c.hidden_size, 0.0f));
}

// -tp 2 on a dense MLP of 200 (mxfp8) leaves 100 down_proj columns per rank, which cuts a 1x32
// scale block: the shard names the tensor, the bound, the block and the dimension, as the
// footprint refuses the same layout.
TEST(ShardWeights, SliceThatCutsAScaleBlockIsAnError) {
  ModelConfig c = shard_config({{"quant_method", "mxfp8"}});
  c.dense_intermediate_size = 200;
  const ModelWeights full = make_dummy_weights(c, 1);
  const ParallelLayout layout = make_parallel_layout({2, 1, false}, model_geometry(c));
  EXPECT_THROW(weight_footprint(c, layout.ranks[1]), Error);
  try {
    shard_weights(full, c, layout.ranks[1]);
    ADD_FAILURE() << "a cut scale block was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "language_model.model.layers.0.mlp.down_proj: column bound 100 of [100, 200) cuts a mxfp8 scale "
                 "block of 32 columns (bounds must be multiples of 32 or in_features 200), for the rank's columns "
                 "[100, 200) of dense_intermediate_size");
  }
}

// Weights of another geometry than the config's: the error names the tensor and the dimension.
TEST(ShardWeights, WeightsThatDisagreeWithTheConfigAreAnError) {
  const ModelConfig c = shard_config(nullptr);
  ModelConfig fewer_heads = c;
  fewer_heads.num_heads = 4;
  const ModelWeights full = make_dummy_weights(c, 1);
  const RankShard s = make_parallel_layout({2, 1, false}, model_geometry(fewer_heads)).ranks[0];
  try {
    shard_weights(full, fewer_heads, s);
    ADD_FAILURE() << "mismatched weights were accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "language_model.model.layers.0.self_attn.q_proj: 1024 output rows where the config's "
                 "num_attention_heads x head_dim make 512");
  }
}

}  // namespace
}  // namespace m3
