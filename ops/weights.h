// The weights a backend consumes: one linear layer in any stored format, and the MLP / expert
// groups of a layer. Plain data: quantized tensors stay quantized (views into the mmap'd
// checkpoint, or device copies in the same formats); a backend expands them on the fly, exactly,
// and never keeps a dequantized copy. model/weights.h assembles them into a whole model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace m3 {

enum class WeightFormat {
  kDense,     // F32 / BF16 / F16 [out, in]
  kFp8,       // F8_E4M3 [out, in], value = fp8 * scale (F32 [1]; 1 when undefined)
  kFp8Block,  // F8_E4M3 [out, in] + F32 scale [ceil(out/128), ceil(in/128)]:
              // value = fp8 * scale[r/128][c/128]
  kMxfp8,     // F8_E4M3 [out, in] + UE8M0 U8 scale [out, ceil(in/32)]: value = fp8 * 2^(s-127)
  kNvfp4,     // U8 [out, ceil(in/2)] (E2M1 pairs, even element in the low nibble) + F8_E4M3 scale
              // [out, ceil(in/16)]: value = e2m1 * e4m3(scale) * global_scale, or exactly
              // e2m1 * e4m3(scale) / global_divisor for compressed-tensors
};
std::string_view weight_format_name(WeightFormat format);

// One linear layer y = x W^T, in whatever format the checkpoint stores.
struct LinearWeight {
  std::string name;  // checkpoint tensor name (without the .weight suffix), for errors
  int64_t out_features = 0;
  int64_t in_features = 0;
  WeightFormat format = WeightFormat::kDense;
  Tensor weight;
  Tensor scale;  // per format above; undefined for kDense
  // kNvfp4 second-level scale as one fp32 multiplier (what kernels use): weight_scale_2 (ModelOpt)
  // or 1/weight_global_scale rounded to fp32 (compressed-tensors).
  float global_scale = 1.0f;
  // compressed-tensors kNvfp4: weight_global_scale as stored; the exact dequantization divides by
  // it (dequantize_rows does). 0 for every other format.
  float global_divisor = 0.0f;
  float input_scale = 0.0f;  // ModelOpt activation scale, recorded only (0 when absent)

  bool defined() const { return weight.defined(); }
  // Rows [begin, end) of the output dimension, sharing memory (kFp8Block: begin and end on
  // 128-row block boundaries, or end = out_features).
  LinearWeight rows(int64_t begin, int64_t end) const;
  // Columns [begin, end) of the input dimension: a new owning host copy in the same format with
  // the scales of those columns (the scalar fields kept). Each bound must lie on the format's
  // scale grid along the input (kFp8Block 128, kMxfp8 32, kNvfp4 16 columns) or equal
  // in_features, so every copied block keeps its own scale; m3::Error naming the tensor, the bound
  // and the block size otherwise. Dense and kFp8 take any bounds.
  LinearWeight columns(int64_t begin, int64_t end) const;
  // The weight grown to `rows` output rows (>= out_features), the new rows zero: zero codes with
  // zero scales dequantize to 0 in every format (an E4M3 or E2M1 zero times any finite scale,
  // UE8M0 0 = 2^-127 included). Itself, sharing memory, when nothing is added; else an owning host
  // copy. For a vocabulary padded to a multiple of -tp.
  LinearWeight padded_rows(int64_t rows) const;
  // Bytes of weight + scales.
  std::size_t nbytes() const;
};

// Bytes of weight + scales of an [out, in] linear stored in `format` (dense: dense_element_bytes
// per element, bf16 by default): what LinearWeight::nbytes() gives for such a tensor, known
// before any tensor exists, so a planner can size a rank's shard of it.
int64_t linear_weight_bytes(WeightFormat format, int64_t out, int64_t in, int dense_element_bytes = 2);

// Input columns that share one scale in `format` (1: no blocks along the input): where a column
// slice of a weight may be cut.
int64_t input_block_columns(WeightFormat format);

// Rows [row_begin, row_end) of W as fp32, exactly per the format's definition, into
// out [(row_end - row_begin) * in_features]. Host tensors only.
void dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out);

struct ExpertWeights {
  LinearWeight gate;  // w1 / first half of gate_up
  LinearWeight up;    // w3 / second half of gate_up
  LinearWeight down;  // w2
};

struct MlpWeights {
  // Dense layers, and the shared expert of MoE layers:
  LinearWeight gate, up, down;
  // MoE layers:
  Tensor router;       // F32 [num_experts, hidden]
  Tensor router_bias;  // F32 [num_experts] (e_score_correction_bias)
  std::vector<ExpertWeights> experts;
};

// The DSpark drafter's Markov and confidence heads (ops/draft_heads.h), as Backend::markov_drafts
// reads them: F32 tensors on the backend's device.
struct MarkovHeadWeights {
  Tensor w1, w2;        // [vocab, rank]
  Tensor confidence_w;  // [hidden + (confidence_with_markov ? rank : 0)]
  float confidence_b = 0.0f;
  bool confidence_with_markov = true;
};

}  // namespace m3
