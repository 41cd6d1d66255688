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

Tensor on_backend(Backend& backend, const Tensor& host) {
  M3_CHECK(host.device() == Device::kCpu, "on_backend: a host tensor expected");
  if (backend.device() != Device::kCpu) return backend.to_device(host, "op check input");
  // A copy on the CPU too: ops may write their inputs in place, and the host inputs serve both sides.
  Tensor t = backend.alloc(host.shape(), host.dtype());
  std::memcpy(t.data(), host.data(), host.nbytes());
  return t;
}

Tensor act_on_backend(Backend& backend, const std::vector<float>& values, int64_t rows, int64_t cols) {
  M3_CHECK(int64_t(values.size()) == rows * cols, "act_on_backend: {} values for [{}, {}]", values.size(), rows,
           cols);
  const DType storage = backend.activation_storage_dtype();
  Tensor host = Tensor::zeros({rows, cols}, storage);
  if (storage == DType::kF32) {
    for (size_t i = 0; i < values.size(); ++i) host.data_as<float>()[i] = bf16_round(values[i]);
  } else {
    M3_CHECK(storage == DType::kBF16, "act_on_backend: storage dtype {}", dtype_name(storage));
    for (size_t i = 0; i < values.size(); ++i) host.data_as<uint16_t>()[i] = bf16_encode(values[i]);
  }
  return on_backend(backend, host);
}

LinearWeight on_backend(Backend& backend, const LinearWeight& host) {
  LinearWeight w = host;
  if (!host.weight.defined()) return w;  // an absent weight (the routed-only MoE's shared expert)
  w.weight = on_backend(backend, host.weight);
  if (host.scale.defined()) w.scale = on_backend(backend, host.scale);
  return w;
}

MlpWeights on_backend(Backend& backend, const MlpWeights& host) {
  MlpWeights m;
  m.gate = on_backend(backend, host.gate);
  m.up = on_backend(backend, host.up);
  m.down = on_backend(backend, host.down);
  if (host.router.defined()) m.router = on_backend(backend, host.router);
  if (host.router_bias.defined()) m.router_bias = on_backend(backend, host.router_bias);
  for (const ExpertWeights& e : host.experts)
    m.experts.push_back({on_backend(backend, e.gate), on_backend(backend, e.up), on_backend(backend, e.down)});
  return m;
}

std::vector<float> read_act(Backend& backend, const Tensor& t) {
  std::vector<float> out(t.numel());
  backend.copy_to_host_f32(t, out.data());
  return out;
}

std::vector<uint8_t> read_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (t.device() == Device::kCpu) {
    std::memcpy(out.data(), t.data(), out.size());
  } else {
    sync_device();
    check_cuda(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost), "download");
  }
  return out;
}

void poison(Tensor& t, uint8_t byte) {
  if (t.device() == Device::kCpu) std::memset(t.data(), byte, t.nbytes());
  else check_cuda(cudaMemset(t.data(), byte, t.nbytes()), "poison");
}

void sync_device() { check_cuda(cudaDeviceSynchronize(), "device synchronize"); }

Tensor to_device(const Tensor& host) {
  Tensor t = cuda::device_tensor(host.shape(), host.dtype(), "test tensor");
  check_cuda(cudaMemcpy(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice), "upload");
  return t;
}

Tensor device_act(const std::vector<float>& values, int64_t rows, int64_t cols) {
  M3_CHECK(int64_t(values.size()) == rows * cols, "device_act: {} values for [{}, {}]", values.size(), rows, cols);
  Tensor host = Tensor::zeros({rows, cols}, DType::kBF16);
  for (size_t i = 0; i < values.size(); ++i) host.data_as<uint16_t>()[i] = bf16_encode(values[i]);
  return to_device(host);
}

std::vector<float> random_values(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(dist(rng));
  return v;
}

Tensor random_f32(std::mt19937_64& rng, int64_t n, float scale) {
  const std::vector<float> v = random_values(rng, size_t(n), scale);
  Tensor t = Tensor::zeros({n}, DType::kF32);
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
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

void configure(Backend& backend, const Geometry& g) {
  BackendConfig c;
  c.activation_dtype = DType::kBF16;
  c.num_q_heads = g.heads;
  c.num_kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.block_size = g.block_size;
  c.has_sparse_layers = g.index_dim > 0;
  c.index_dim = g.index_dim;
  c.indexer = {g.index_heads, g.topk, g.local_blocks, g.init_blocks};
  c.rotary_dim = g.rotary_dim;
  // Default RoPE (theta 5e6) as modeling_rope_utils computes it.
  for (int i = 0; i < g.rotary_dim / 2; ++i)
    c.rope_inv_freq.push_back(static_cast<float>(1.0 / std::pow(5000000.0, 2.0 * i / g.rotary_dim)));
  backend.configure(c);
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
