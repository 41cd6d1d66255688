#include "engine/model_runner.h"

#include <algorithm>

#include "core/error.h"

namespace m3 {

void ModelRunner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                 RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) {
  const int vocab = vocab_size();
  const size_t rows = batch.logits_rows.size();
  std::vector<float> logits(rows * static_cast<size_t>(vocab));
  forward(batch, logits.data());
  for (size_t i = 0; i < host_rows.size(); ++i) {
    M3_CHECK(host_rows[i] >= 0 && size_t(host_rows[i]) < rows, "host logits row {} outside the step's {} rows",
             host_rows[i], rows);
    std::copy_n(logits.data() + size_t(host_rows[i]) * vocab, vocab, host_logits + i * vocab);
  }
  SampleWorkspace ws;
  sample_batch_reference(logits.data(), static_cast<int64_t>(rows), vocab, sampling, sampled_ids, ws);
  logprobs_batch_reference(logits.data(), static_cast<int64_t>(rows), vocab, sampling, sampled_ids, logprobs);
}

void ModelRunner::copy_kv_blocks(const KvBlockCopies& copies) {
  fail("this model runner has no host tier for KV blocks ({} copies to host, {} back asked for)",
       copies.to_host.size(), copies.to_device.size());
}

}  // namespace m3
