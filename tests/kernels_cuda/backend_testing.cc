#include "tests/kernels_cuda/backend_testing.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "formats/bf16.h"
#include "formats/rows.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3::test {

using cuda::check_cuda;

Tensor host_act(const std::vector<float>& values, int64_t rows, int64_t cols) {
  M3_CHECK(int64_t(values.size()) == rows * cols, "host_act: {} values for [{}, {}]", values.size(), rows, cols);
  Tensor t = Tensor::zeros({rows, cols}, DType::kF32);
  for (size_t i = 0; i < values.size(); ++i) t.data_as<float>()[i] = bf16_round(values[i]);
  return t;
}

Tensor device_act(const std::vector<float>& values, int64_t rows, int64_t cols) {
  M3_CHECK(int64_t(values.size()) == rows * cols, "device_act: {} values for [{}, {}]", values.size(), rows, cols);
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bf16_encode(values[i]);
  Tensor t = cuda::device_tensor({rows, cols}, DType::kBF16, "test activation");
  check_cuda(cudaMemcpy(t.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "upload");
  return t;
}

std::vector<float> read_host(const Tensor& t) {
  M3_CHECK(t.dtype() == DType::kF32 && t.device() == Device::kCpu, "read_host: F32 host tensor expected");
  return std::vector<float>(t.data_as<const float>(), t.data_as<const float>() + t.numel());
}

std::vector<float> read_device(const Tensor& t) {
  check_cuda(cudaDeviceSynchronize(), "read_device");
  std::vector<float> out(t.numel());
  if (t.dtype() == DType::kF32) {
    check_cuda(cudaMemcpy(out.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  M3_CHECK(t.dtype() == DType::kBF16, "read_device: {}", dtype_name(t.dtype()));
  std::vector<uint16_t> bits(t.numel());
  check_cuda(cudaMemcpy(bits.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost), "download");
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_decode(bits[i]);
  return out;
}

Tensor to_device(const Tensor& host) {
  Tensor t = cuda::device_tensor(host.shape(), host.dtype(), "test tensor");
  check_cuda(cudaMemcpy(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice), "upload");
  return t;
}

std::vector<uint8_t> read_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (t.device() == Device::kCpu) {
    std::memcpy(out.data(), t.data(), out.size());
  } else {
    check_cuda(cudaDeviceSynchronize(), "read_bytes");
    check_cuda(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost), "download");
  }
  return out;
}

std::vector<float> random_values(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(dist(rng));
  return v;
}

LinearWeight random_linear(std::mt19937_64& rng, const std::string& name, int64_t out, int64_t in,
                           WeightFormat format, DType dense_dtype, float nvfp4_divisor) {
  const float sd = 1.0f / std::sqrt(static_cast<float>(in));
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> w(size_t(out) * in);
  for (float& x : w) x = dist(rng);
  LinearWeight l;
  l.name = name;
  l.out_features = out;
  l.in_features = in;
  l.format = format;
  switch (format) {
    case WeightFormat::kDense: {
      l.weight = Tensor::zeros({out, in}, dense_dtype);
      for (size_t i = 0; i < w.size(); ++i) {
        if (dense_dtype == DType::kF32) l.weight.data_as<float>()[i] = w[i];
        else if (dense_dtype == DType::kBF16) l.weight.data_as<uint16_t>()[i] = bf16_encode(w[i]);
        else l.weight.data_as<uint16_t>()[i] = fp16_encode(w[i]);
      }
      break;
    }
    case WeightFormat::kFp8: {
      const float scale = 2.0f * sd / 448.0f * 8.0f;
      l.weight = Tensor::zeros({out, in}, DType::kF8E4M3);
      for (size_t i = 0; i < w.size(); ++i) l.weight.data_as<uint8_t>()[i] = fp8_e4m3_encode(w[i] / scale);
      l.scale = Tensor::zeros({1}, DType::kF32);
      l.scale.data_as<float>()[0] = scale;
      break;
    }
    case WeightFormat::kFp8Block: {
      const int64_t sr = (out + 127) / 128, sc = (in + 127) / 128;
      l.weight = Tensor::zeros({out, in}, DType::kF8E4M3);
      l.scale = Tensor::zeros({sr, sc}, DType::kF32);
      std::uniform_real_distribution<float> u(0.5f, 2.0f);
      for (int64_t i = 0; i < sr * sc; ++i) l.scale.data_as<float>()[i] = u(rng) * 8.0f * sd / 448.0f;
      for (int64_t r = 0; r < out; ++r)
        for (int64_t c = 0; c < in; ++c)
          l.weight.data_as<uint8_t>()[r * in + c] =
              fp8_e4m3_encode(w[r * in + c] / l.scale.data_as<float>()[(r / 128) * sc + c / 128]);
      break;
    }
    case WeightFormat::kMxfp8: {
      const int64_t sc = (in + 31) / 32;
      l.weight = Tensor::zeros({out, in}, DType::kF8E4M3);
      l.scale = Tensor::zeros({out, sc}, DType::kU8);
      for (int64_t r = 0; r < out; ++r)
        mxfp8_quantize_row(w.data() + r * in, in, l.weight.data_as<uint8_t>() + r * in, l.scale.data_as<uint8_t>() + r * sc);
      break;
    }
    case WeightFormat::kNvfp4: {
      const int64_t sc = (in + 15) / 16;
      const float global = nvfp4_divisor > 0 ? nvfp4_divisor : 1.0f / 0.0123f;
      l.weight = Tensor::zeros({out, (in + 1) / 2}, DType::kU8);
      l.scale = Tensor::zeros({out, sc}, DType::kF8E4M3);
      for (int64_t r = 0; r < out; ++r)
        nvfp4_quantize_row(w.data() + r * in, in, global, l.weight.data_as<uint8_t>() + r * ((in + 1) / 2),
                           l.scale.data_as<uint8_t>() + r * sc);
      if (nvfp4_divisor > 0) {
        l.global_divisor = nvfp4_divisor;
        l.global_scale = 1.0f / nvfp4_divisor;
      } else {
        l.global_scale = 0.0123f;  // ModelOpt weight_scale_2: a multiplier
      }
      break;
    }
  }
  return l;
}

LinearWeight upload_linear(const LinearWeight& w) {
  LinearWeight d = w;
  d.weight = to_device(w.weight);
  if (w.scale.defined()) d.scale = to_device(w.scale);
  return d;
}

ModelConfig make_config(const Geometry& g) {
  ModelConfig c;
  c.model_type = "minimax_m3_vl_text";
  c.vocab_size = 1000;
  c.hidden_size = g.hidden;
  c.num_layers = 1;
  c.num_heads = g.heads;
  c.num_kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.max_position_embeddings = 1 << 20;
  c.rope.rotary_dim = g.rotary_dim;
  c.rope.theta = 5000000.0;
  for (int i = 0; i < g.rotary_dim / 2; ++i)
    c.rope.inv_freq.push_back(static_cast<float>(1.0 / std::pow(c.rope.theta, 2.0 * i / g.rotary_dim)));
  c.attention_kinds = {g.index_dim > 0 ? AttentionKind::kSparse : AttentionKind::kFull};
  c.mlp_kinds = {MlpKind::kMoe};
  c.index_heads = g.index_heads;
  c.index_head_dim = g.index_dim;
  c.index_block_size = g.block_size;
  c.index_topk_blocks = g.topk;
  c.index_local_blocks = g.local_blocks;
  c.index_init_blocks = g.init_blocks;
  return c;
}

Error compare(const std::vector<float>& got, const std::vector<float>& want) {
  M3_CHECK(got.size() == want.size(), "compare: {} vs {} values", got.size(), want.size());
  Error e;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= e.max_abs)) e.max_abs = std::isnan(d) ? INFINITY : d;
    e.max_ref = std::max(e.max_ref, std::fabs(double(want[i])));
  }
  return e;
}

}  // namespace m3::test
