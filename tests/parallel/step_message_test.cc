// The step as the control group carries it (parallel/step_message.h): every StepBatch field
// survives the round trip, empty steps and the control kinds included, and corrupt headers are
// refused rather than run.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/step_message.h"

namespace m3 {
namespace {

StepBatch example() {
  StepBatch b;
  b.token_ids = {11, 12, 13, 500, 501};
  b.positions = {0, 1, 2, 40, 41};
  b.token_seq = {0, 0, 0, 1, 1};
  b.query_start = {0, 3, 5};
  b.seq_lens = {3, 42};
  b.pages_per_seq = 3;
  b.page_table = {7, 0, 0, 2, 9, 4};
  b.slot_mapping = {896, 897, 898, 552, 553};
  b.logits_rows = {2, 4};
  return b;
}

void expect_same(const StepBatch& a, const StepBatch& b) {
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.token_seq, b.token_seq);
  EXPECT_EQ(a.query_start, b.query_start);
  EXPECT_EQ(a.seq_lens, b.seq_lens);
  EXPECT_EQ(a.pages_per_seq, b.pages_per_seq);
  EXPECT_EQ(a.page_table, b.page_table);
  EXPECT_EQ(a.slot_mapping, b.slot_mapping);
  EXPECT_EQ(a.logits_rows, b.logits_rows);
}

TEST(StepMessage, EveryFieldSurvivesTheRoundTrip) {
  const StepBatch b = example();
  const StepMessage m = encode_step(StepKind::kForwardSample, b);
  EXPECT_EQ(m.kind(), StepKind::kForwardSample);
  EXPECT_EQ(m.payload_size(), 5 * 4 + 3 + 2 + 6 + 2);
  EXPECT_EQ(static_cast<int64_t>(m.payload.size()), m.payload_size());
  expect_same(decode_step(m), b);
}

TEST(StepMessage, EmptyStepsAndControlKinds) {
  for (StepKind k : {StepKind::kStop, StepKind::kHeartbeat, StepKind::kForward}) {
    const StepMessage m = encode_step(k);
    EXPECT_EQ(m.kind(), k);
    EXPECT_EQ(m.payload_size(), 0);
    const StepBatch b = decode_step(m);
    EXPECT_EQ(b.num_tokens(), 0);
    EXPECT_EQ(b.num_seqs(), 0);
  }
}

TEST(StepMessage, CorruptHeadersAreRefused) {
  StepMessage m = encode_step(StepKind::kForward, example());
  StepMessage bad_kind = m;
  bad_kind.header[0] = 17;
  EXPECT_THROW(decode_step(bad_kind), Error);
  StepMessage bad_size = m;
  bad_size.header[3] += 1;  // sizes no longer add up to the payload
  EXPECT_THROW(check_step_header(bad_size.header), Error);
  StepMessage negative = m;
  negative.header[2] = -1;
  negative.header[3] += 6;
  EXPECT_THROW(check_step_header(negative.header), Error);
  StepMessage short_payload = m;
  short_payload.payload.pop_back();
  EXPECT_THROW(decode_step(short_payload), Error);
}

}  // namespace
}  // namespace m3
