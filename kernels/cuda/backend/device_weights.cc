// Device memory helpers and the upload of a model's weights to the GPU in their stored formats.
#include <unordered_map>

#include "core/log.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"

namespace m3 {
namespace cuda {

Tensor device_tensor(Shape shape, DType dtype, const char* what) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* ptr = nullptr;
  const cudaError_t e = cudaMalloc(&ptr, bytes ? bytes : 16);
  if (e != cudaSuccess) {
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    fail("out of GPU memory allocating {} ({} {}, {:.1f} MiB; {:.1f} MiB free of {:.1f} MiB): {}", what,
         dtype_name(dtype), shape_string(shape), bytes / 1048576.0, free_bytes / 1048576.0, total / 1048576.0,
         cudaGetErrorString(e));
  }
  check_cuda(cudaMemset(ptr, 0, bytes ? bytes : 16), what);
  return Tensor::wrap(ptr, std::move(shape), dtype, Device::kCuda, std::shared_ptr<void>(ptr, [](void* p) {
                        cudaFree(p);
                      }));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

bool DeviceBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return false;
  if (moves_) ++*moves_;
  if (ptr_) check_cuda(cudaFree(ptr_), what);
  ptr_ = nullptr;
  bytes_ = 0;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  M3_CHECK(e == cudaSuccess, "out of GPU memory growing {} to {:.1f} MiB: {}", what, bytes / 1048576.0,
           cudaGetErrorString(e));
  bytes_ = bytes;
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}

void PinnedBuffer::reserve(size_t bytes, const char* what) {
  if (bytes <= bytes_) return;
  if (ptr_) check_cuda(cudaFreeHost(ptr_), what);
  ptr_ = nullptr;
  bytes_ = 0;
  check_cuda(cudaMallocHost(&ptr_, bytes), what);
  bytes_ = bytes;
}

}  // namespace cuda

namespace {

// Copies host tensors to the device once per distinct host buffer.
class Uploader {
 public:
  Tensor operator()(const Tensor& t, const std::string& name) {
    if (!t.defined()) return t;
    if (t.device() == Device::kCuda) return t;
    auto it = done_.find(t.data());
    if (it != done_.end() && it->second.nbytes() == t.nbytes()) return it->second.reshape(t.shape());
    Tensor d = cuda::device_tensor(t.shape(), t.dtype(), name.c_str());
    cuda::check_cuda(cudaMemcpy(d.data(), t.data(), t.nbytes(), cudaMemcpyHostToDevice), name.c_str());
    bytes_ += static_cast<int64_t>(t.nbytes());
    done_.emplace(t.data(), d);
    return d;
  }
  LinearWeight operator()(const LinearWeight& w) {
    LinearWeight d = w;
    d.weight = (*this)(w.weight, w.name + ".weight");
    d.scale = (*this)(w.scale, w.name + ".weight_scale");
    return d;
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::unordered_map<const void*, Tensor> done_;
  int64_t bytes_ = 0;
};

void add_bytes(const Tensor& t, std::unordered_map<const void*, int64_t>& seen) {
  if (t.defined() && t.device() == Device::kCpu) seen.emplace(t.data(), static_cast<int64_t>(t.nbytes()));
}

}  // namespace

int64_t cuda_weight_bytes(const ModelWeights& w) {
  std::unordered_map<const void*, int64_t> seen;
  auto linear = [&](const LinearWeight& l) {
    add_bytes(l.weight, seen);
    add_bytes(l.scale, seen);
  };
  add_bytes(w.embed, seen);
  add_bytes(w.final_norm, seen);
  linear(w.lm_head);
  for (const LayerWeights& l : w.layers) {
    add_bytes(l.input_norm, seen);
    add_bytes(l.post_attn_norm, seen);
    for (const LinearWeight* x : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o, &l.attn.index_q, &l.attn.index_k})
      linear(*x);
    for (const Tensor* t : {&l.attn.q_norm, &l.attn.k_norm, &l.attn.index_q_norm, &l.attn.index_k_norm})
      add_bytes(*t, seen);
    linear(l.mlp.gate);
    linear(l.mlp.up);
    linear(l.mlp.down);
    add_bytes(l.mlp.router, seen);
    add_bytes(l.mlp.router_bias, seen);
    for (const ExpertWeights& e : l.mlp.experts) {
      linear(e.gate);
      linear(e.up);
      linear(e.down);
    }
  }
  int64_t total = 0;
  for (const auto& [ptr, bytes] : seen) total += bytes;
  return total;
}

ModelWeights upload_weights_to_cuda(const ModelWeights& host) {
  Uploader up;
  ModelWeights d;
  d.embed = up(host.embed, "embed_tokens");
  d.final_norm = up(host.final_norm, "norm");
  d.lm_head = up(host.lm_head);
  d.layers.reserve(host.layers.size());
  for (size_t i = 0; i < host.layers.size(); ++i) {
    const LayerWeights& h = host.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights l;
    l.input_norm = up(h.input_norm, p + "input_layernorm");
    l.post_attn_norm = up(h.post_attn_norm, p + "post_attention_layernorm");
    l.attn.q = up(h.attn.q);
    l.attn.k = up(h.attn.k);
    l.attn.v = up(h.attn.v);
    l.attn.o = up(h.attn.o);
    l.attn.q_norm = up(h.attn.q_norm, p + "q_norm");
    l.attn.k_norm = up(h.attn.k_norm, p + "k_norm");
    l.attn.index_q = up(h.attn.index_q);
    l.attn.index_k = up(h.attn.index_k);
    l.attn.index_q_norm = up(h.attn.index_q_norm, p + "index_q_norm");
    l.attn.index_k_norm = up(h.attn.index_k_norm, p + "index_k_norm");
    l.mlp.gate = up(h.mlp.gate);
    l.mlp.up = up(h.mlp.up);
    l.mlp.down = up(h.mlp.down);
    l.mlp.router = up(h.mlp.router, p + "router");
    l.mlp.router_bias = up(h.mlp.router_bias, p + "e_score_correction_bias");
    l.mlp.experts.reserve(h.mlp.experts.size());
    for (const ExpertWeights& e : h.mlp.experts) l.mlp.experts.push_back({up(e.gate), up(e.up), up(e.down)});
    d.layers.push_back(std::move(l));
  }
  M3_LOG_INFO("weights on the GPU: {:.2f} GiB", up.bytes() / 1073741824.0);
  return d;
}

}  // namespace m3
