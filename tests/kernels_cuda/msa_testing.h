// Shared pieces of the GPU check and benchmark programs: device memory, step construction with
// several page-table layouts, and random data.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "ops/attention.h"
#include "ops/step_batch.h"

namespace m3::cuda::testing {

void check(cudaError_t e, const char* what);
#define MSA_CUDA(call) ::m3::cuda::testing::check((call), #call)

// Owning device allocation.
class DeviceMem {
 public:
  DeviceMem() = default;
  explicit DeviceMem(size_t bytes);
  DeviceMem(DeviceMem&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceMem& operator=(DeviceMem&& o) noexcept;
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  ~DeviceMem();
  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <class T>
DeviceMem upload(const std::vector<T>& v) {
  DeviceMem m(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) MSA_CUDA(cudaMemcpy(m.as(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return m;
}
template <class T>
std::vector<T> download(const DeviceMem& m, size_t count) {
  std::vector<T> v(count);
  if (count) MSA_CUDA(cudaMemcpy(v.data(), m.as(), count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

enum class PageLayout { kDisjoint, kPermuted, kSharedPrefix };
const char* page_layout_name(PageLayout layout);

struct SeqSpec {
  int q_len;    // new tokens this step (decode: 1..16; prefill chunk: any)
  int seq_len;  // KV length after the step, new tokens included
};

// A step over `seqs` with physical blocks laid out per `layout` (kSharedPrefix: every sequence
// shares the first `shared_prefix_blocks` physical blocks, which must be full history blocks of
// all of them). num_blocks is the pool size the step needs.
struct BuiltStep {
  StepBatch batch;
  int num_blocks = 0;
};
BuiltStep build_step(const std::vector<SeqSpec>& seqs, int block_size, PageLayout layout,
                     int shared_prefix_blocks, std::mt19937_64& rng);

// The step's arrays on the device and the StepView over them.
struct DeviceStep {
  DeviceMem positions, token_seq, seq_lens, page_table, slot_mapping;
  StepView view;
};
DeviceStep upload_step(const StepBatch& batch);
StepView host_view(const StepBatch& batch);

// Random values rounded to bf16 (as floats) and their bf16 bits.
void random_bf16(std::mt19937_64& rng, size_t n, float stddev, std::vector<float>& values,
                 std::vector<uint16_t>& bits);

}  // namespace m3::cuda::testing
