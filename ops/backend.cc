#include "ops/backend.h"

#include <vector>

#include "core/error.h"

namespace m3 {

void Backend::sample(const Tensor& logits, const SampleBatch& batch, int32_t* ids) {
  if (batch.rows.empty()) return;
  M3_CHECK(logits.ndim() == 2, "sample: logits must be [rows, vocab], got {}", shape_string(logits.shape()));
  const int64_t vocab = logits.dim(1);
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  copy_to_host_f32(logits, host.data());
  SampleWorkspace ws;
  sample_batch_reference(host.data(), logits.dim(0), static_cast<int32_t>(vocab), batch, ids, ws);
}

}  // namespace m3
