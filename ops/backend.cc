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
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const SampleRow& row = batch.rows[i];
    M3_CHECK(row.logits_row >= 0 && row.logits_row < logits.dim(0), "sample: row {} reads logits row {} of {}", i,
             row.logits_row, logits.dim(0));
    ids[i] = sample_reference(host.data() + row.logits_row * vocab, static_cast<int32_t>(vocab), row, batch, ws);
  }
}

}  // namespace m3
