#include "parallel/step_message.h"

#include "core/error.h"

namespace m3 {
namespace {

// StepBatch's vectors, in the order they travel.
constexpr std::array<std::vector<int32_t> StepBatch::*, 8> kVectors = {
    &StepBatch::token_ids,   &StepBatch::positions,    &StepBatch::token_seq,  &StepBatch::query_start,
    &StepBatch::seq_lens,    &StepBatch::page_table,   &StepBatch::slot_mapping, &StepBatch::logits_rows};
static_assert(kStepHeaderWords == 2 + kVectors.size() + 1);

}  // namespace

StepMessage encode_step(StepKind kind, const StepBatch& batch) {
  StepMessage m;
  m.header[0] = static_cast<int64_t>(kind);
  m.header[1] = batch.pages_per_seq;
  int64_t total = 0;
  for (size_t i = 0; i < kVectors.size(); ++i) {
    const auto& v = batch.*kVectors[i];
    m.header[2 + i] = static_cast<int64_t>(v.size());
    total += static_cast<int64_t>(v.size());
  }
  m.header[kStepHeaderWords - 1] = total;
  m.payload.reserve(total);
  for (const auto member : kVectors) {
    const auto& v = batch.*member;
    m.payload.insert(m.payload.end(), v.begin(), v.end());
  }
  return m;
}

void check_step_header(const std::array<int64_t, kStepHeaderWords>& header) {
  M3_CHECK(header[0] >= 0 && header[0] <= static_cast<int64_t>(StepKind::kHeartbeat),
           "step message: unknown kind {} (node 0 and this process run different m3serve builds?)", header[0]);
  M3_CHECK(header[1] >= 0, "step message: pages_per_seq {}", header[1]);
  int64_t total = 0;
  for (size_t i = 0; i < kVectors.size(); ++i) {
    M3_CHECK(header[2 + i] >= 0 && header[2 + i] < (int64_t{1} << 31), "step message: vector {} has size {}", i,
             header[2 + i]);
    total += header[2 + i];
  }
  M3_CHECK(total == header[kStepHeaderWords - 1], "step message: vector sizes add up to {}, the payload holds {}",
           total, header[kStepHeaderWords - 1]);
}

StepBatch decode_step(const StepMessage& m) {
  check_step_header(m.header);
  M3_CHECK(static_cast<int64_t>(m.payload.size()) == m.payload_size(),
           "step message: {} payload words, the header says {}", m.payload.size(), m.payload_size());
  StepBatch batch;
  batch.pages_per_seq = static_cast<int32_t>(m.header[1]);
  auto at = m.payload.begin();
  for (size_t i = 0; i < kVectors.size(); ++i) {
    const auto n = static_cast<std::ptrdiff_t>(m.header[2 + i]);
    (batch.*kVectors[i]).assign(at, at + n);
    at += n;
  }
  return batch;
}

}  // namespace m3
