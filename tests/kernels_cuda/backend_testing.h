// Shared pieces of the CUDA backend checks (backend_check): moving activations between the CPU
// reference's F32 tensors and the CUDA backend's BF16 device tensors, random data, quantized
// random weights in every WeightFormat, error measures.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/minimax_m3.h"
#include "model/weights.h"

namespace m3::test {

// Host F32 [rows, cols] holding bf16-rounded values (what the CPU backend stores in bf16 mode).
Tensor host_act(const std::vector<float>& values, int64_t rows, int64_t cols);
// Device BF16 [rows, cols] of the same values.
Tensor device_act(const std::vector<float>& values, int64_t rows, int64_t cols);
std::vector<float> read_host(const Tensor& t);    // F32 host tensor
std::vector<float> read_device(const Tensor& t);  // BF16 or F32 device tensor -> fp32
Tensor to_device(const Tensor& host);             // any dtype, bytes as they are
std::vector<uint8_t> read_bytes(const Tensor& t);  // host or device

// N(0, scale) values rounded to bf16.
std::vector<float> random_values(std::mt19937_64& rng, size_t n, float scale);

// A random linear layer of `format` (dense dtype for kDense): values ~ N(0, 1/in) quantized the
// way checkpoints are; nvfp4_divisor selects compressed-tensors (> 0) or ModelOpt (0) NVFP4.
LinearWeight random_linear(std::mt19937_64& rng, const std::string& name, int64_t out, int64_t in,
                           WeightFormat format, DType dense_dtype = DType::kBF16,
                           float nvfp4_divisor = 0.0f);
LinearWeight upload_linear(const LinearWeight& w);

// A synthetic config for op checks (sizes as given, RoPE tables as modeling_rope_utils).
struct Geometry {
  std::string name;
  int hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int index_heads = 0, index_dim = 0, block_size = 0, topk = 0, local_blocks = 1, init_blocks = 0;
  int rotary_dim = 0;
};
ModelConfig make_config(const Geometry& g);

struct Error {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_abs / (max_ref > 0 ? max_ref : 1e-30); }
};
Error compare(const std::vector<float>& got, const std::vector<float>& want);

}  // namespace m3::test
