// The step as the control group carries it (parallel/step_message.h): every StepBatch field
// survives the round trip, empty steps and the control kinds included, and so do the host tier's
// KV block copies; corrupt headers are refused rather than run.
#include <gtest/gtest.h>

#include <utility>

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

TEST(StepMessage, KvCopiesSurviveTheRoundTrip) {
  KvBlockCopies c;
  c.batch = 9;
  c.wait_for_batch = 4;
  c.to_host = {{3, 0}, {5, 17}};
  c.to_device = {{1, 17}};
  c.to_host_ahead = {{2, 6}, {7, 8}, {0, 2}};
  const StepMessage m = encode_kv_copies(c);
  EXPECT_EQ(m.kind(), StepKind::kCopyKvBlocks);
  EXPECT_EQ(m.payload_size(), 2 * 6);
  const KvBlockCopies back = decode_kv_copies(m);
  EXPECT_EQ(back.batch, 9u);
  EXPECT_EQ(back.wait_for_batch, 4u);
  const auto pairs = [](const std::vector<KvBlockCopy>& v) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const KvBlockCopy& x : v) out.emplace_back(x.block, x.host_slot);
    return out;
  };
  EXPECT_EQ(pairs(back.to_host), pairs(c.to_host));
  EXPECT_EQ(pairs(back.to_device), pairs(c.to_device));
  EXPECT_EQ(pairs(back.to_host_ahead), pairs(c.to_host_ahead));
  // An empty batch (nothing to copy, nothing to wait for) is a message too.
  const KvBlockCopies none = decode_kv_copies(encode_kv_copies(KvBlockCopies{}));
  EXPECT_TRUE(none.empty());
  // Copies are not a step, and a step holds no copies.
  EXPECT_THROW(decode_step(m), Error);
  EXPECT_THROW(decode_kv_copies(encode_step(StepKind::kForward, example())), Error);
}

TEST(StepMessage, CorruptKvCopiesAreRefused) {
  KvBlockCopies c;
  c.batch = 2;
  c.to_device = {{1, 3}, {2, 4}};
  const StepMessage m = encode_kv_copies(c);
  StepMessage bad_count = m;
  bad_count.header[4] += 1;  // more copies than the payload holds
  EXPECT_THROW(check_step_header(bad_count.header), Error);
  StepMessage stray = m;
  stray.header[7] = 5;  // a word a copies header leaves zero
  EXPECT_THROW(check_step_header(stray.header), Error);
  StepMessage later_wait = m;
  later_wait.header[2] = 3;  // waits for a batch after its own
  EXPECT_THROW(check_step_header(later_wait.header), Error);
  StepMessage negative = m;
  negative.payload[1] = -4;
  EXPECT_THROW(decode_kv_copies(negative), Error);
  StepMessage short_payload = m;
  short_payload.payload.pop_back();
  EXPECT_THROW(decode_kv_copies(short_payload), Error);
  KvBlockCopies huge;
  huge.to_host = {{int64_t{1} << 32, 0}};
  EXPECT_THROW(encode_kv_copies(huge), Error);
}

// A remote draft's words are the engine's: the header holds only their count, and it is no step.
TEST(StepMessage, RemoteDraftsCarryTheirWords) {
  const StepMessage m = encode_remote_draft({4, 5, 6});
  EXPECT_EQ(m.kind(), StepKind::kRemoteDraft);
  EXPECT_EQ(m.payload_size(), 3);
  EXPECT_NO_THROW(check_step_header(m.header));
  EXPECT_THROW(decode_step(m), Error);
  StepMessage stray = m;
  stray.header[4] = 1;
  EXPECT_THROW(check_step_header(stray.header), Error);
  StepMessage negative = m;
  negative.header[kStepHeaderWords - 1] = -3;
  EXPECT_THROW(check_step_header(negative.header), Error);
}

}  // namespace
}  // namespace m3
