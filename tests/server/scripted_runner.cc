#include "tests/server/scripted_runner.h"

#include <algorithm>

#include "core/error.h"

namespace m3::testing {
namespace {

// Index just past the last occurrence of `needle` in h[0, end), or -1.
int64_t last_end_of(const std::vector<int32_t>& h, int64_t end,
                    const std::vector<int32_t>& needle) {
  if (needle.empty() || static_cast<int64_t>(needle.size()) > end) return -1;
  for (int64_t stop = end; stop >= static_cast<int64_t>(needle.size()); --stop) {
    if (std::equal(needle.begin(), needle.end(), h.begin() + (stop - needle.size()))) return stop;
  }
  return -1;
}

}  // namespace

ScriptedRunner::ScriptedRunner(int vocab_size, int block_size, int64_t num_kv_blocks,
                               std::vector<int32_t> marker, std::vector<ScriptedReply> replies,
                               int32_t eos_token_id)
    : vocab_size_(vocab_size),
      block_size_(block_size),
      num_kv_blocks_(num_kv_blocks),
      marker_(std::move(marker)),
      replies_(std::move(replies)),
      eos_(eos_token_id),
      slots_(static_cast<size_t>(num_kv_blocks * block_size), -1) {
  M3_CHECK(!marker_.empty(), "the scripted model needs a generation marker");
}

int32_t ScriptedRunner::predict(const std::vector<int32_t>& h) const {
  int64_t start = last_end_of(h, static_cast<int64_t>(h.size()), marker_);
  if (start < 0) return eos_;
  for (const ScriptedReply& reply : replies_) {
    if (!reply.trigger.empty() && last_end_of(h, start, reply.trigger) < 0) continue;
    size_t j = h.size() - static_cast<size_t>(start);
    return j < reply.tokens.size() ? reply.tokens[j] : eos_;
  }
  return eos_;
}

void ScriptedRunner::forward(const StepBatch& batch, float* logits) {
  for (int t = 0; t < batch.num_tokens(); ++t) {
    slots_.at(static_cast<size_t>(batch.slot_mapping[t])) = batch.token_ids[t];
  }
  std::vector<int32_t> history;
  for (size_t r = 0; r < batch.logits_rows.size(); ++r) {
    const int t = batch.logits_rows[r];
    const int s = batch.token_seq[t];
    const int p = batch.positions[t];
    history.assign(static_cast<size_t>(p) + 1, -1);
    for (int q = 0; q <= p; ++q) {
      int32_t block =
          batch.page_table[static_cast<size_t>(s) * batch.pages_per_seq + q / block_size_];
      history[q] = slots_.at(static_cast<size_t>(block) * block_size_ + q % block_size_);
    }
    float* row = logits + r * static_cast<size_t>(vocab_size_);
    std::fill(row, row + vocab_size_, -10.0f);
    row[predict(history)] = 10.0f;
  }
}

}  // namespace m3::testing
