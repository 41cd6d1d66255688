// One engine step as the control group carries it from node 0 to the other hosts' processes
// (parallel/control_group.h): a fixed header of int64 words (what to do, StepBatch's scalar and
// the length of each of its vectors), then the vectors back to back as one int32 array. Two
// broadcasts of plain integers, so the followers know the second one's size from the first.
// The KV block copies of the prefix cache's host tier travel the same way, ahead of the step
// they belong to: the header holds the batch numbers and the three lists' lengths, the payload
// the (block, host slot) pairs.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "ops/kv_layout.h"
#include "ops/step_batch.h"

namespace m3 {

enum class StepKind : int64_t {
  kStop = 0,           // node 0 is done: the followers leave their loop
  kForward = 1,        // ModelRunner::forward
  kForwardSample = 2,  // forward_sample (rank 0 samples; to the followers' ranks a forward)
  kHeartbeat = 3,      // no step: node 0 is alive and idle (keeps the followers' wait bounded)
  kCopyKvBlocks = 4,   // ModelRunner::copy_kv_blocks, before the step that needs them
};

inline constexpr int kStepHeaderWords = 11;  // kind, pages_per_seq, 8 vector sizes, payload size

struct StepMessage {
  std::array<int64_t, kStepHeaderWords> header{};
  std::vector<int32_t> payload;  // StepBatch's vectors in declaration order

  StepKind kind() const { return static_cast<StepKind>(header[0]); }
  int64_t payload_size() const { return header[kStepHeaderWords - 1]; }
};

StepMessage encode_step(StepKind kind, const StepBatch& batch = {});
// Block ids and host slots must fit in int32 (an m3::Error names the one that does not).
StepMessage encode_kv_copies(const KvBlockCopies& copies);
// Checks the header (a known kind, sizes that add up to the payload, no negative size) and throws
// m3::Error naming what is wrong: a corrupt message must not become a step.
void check_step_header(const std::array<int64_t, kStepHeaderWords>& header);
StepBatch decode_step(const StepMessage& message);          // any kind but kCopyKvBlocks
KvBlockCopies decode_kv_copies(const StepMessage& message);  // kCopyKvBlocks

}  // namespace m3
