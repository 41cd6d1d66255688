#include "engine/model_runner.h"

#include <algorithm>

#include "core/error.h"

namespace m3 {

void ModelRunner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                 const std::vector<int32_t>& host_rows, float* host_logits) {
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
  for (size_t i = 0; i < sampling.rows.size(); ++i) {
    const SampleRow& row = sampling.rows[i];
    M3_CHECK(row.logits_row >= 0 && size_t(row.logits_row) < rows, "sampling row reads logits row {} of {}",
             row.logits_row, rows);
    sampled_ids[i] = sample_reference(logits.data() + size_t(row.logits_row) * vocab, vocab, row, sampling, ws);
  }
}

}  // namespace m3
