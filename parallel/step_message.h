// One engine step as the control group carries it from node 0 to the other hosts' processes
// (parallel/control_group.h): a fixed header of int64 words (what to do, StepBatch's scalar and
// the length of each of its vectors), then the vectors back to back as one int32 array. Two
// broadcasts of plain integers, so the followers know the second one's size from the first.
// The KV block copies of the prefix cache's host tier travel the same way, ahead of the step
// they belong to: the header holds the batch numbers and the three lists' lengths, the payload
// the (block, host slot) pairs.
//
// Under DEP over several hosts, node 0 drives each copy held by another host over a channel of
// its own (a control group of two): a kRemoteSample step is followed by its sampling (a
// SampleMessage), and the copy's node answers with the sampled ids and logits rows (RemoteReply);
// a kRemoteDraft asks the copy's drafter for drafts the same way.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/kv_layout.h"
#include "ops/sampling.h"
#include "ops/step_batch.h"

namespace m3 {

enum class StepKind : int64_t {
  kStop = 0,           // node 0 is done: the followers leave their loop
  kForward = 1,        // ModelRunner::forward
  kForwardSample = 2,  // forward_sample (rank 0 samples; to the followers' ranks a forward)
  kHeartbeat = 3,      // no step: node 0 is alive and idle (keeps the followers' wait bounded)
  kCopyKvBlocks = 4,   // ModelRunner::copy_kv_blocks, before the step that needs them
  kRemoteSample = 5,   // forward_sample on the copy's node: a SampleMessage follows, a reply goes back
  kIdleStep = 6,       // ModelRunner::idle_step (a DEP copy joins its peers' step)
  kRemoteDraft = 7,    // the copy's drafter proposes: the payload is the blocks, a reply goes back
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
// A kRemoteDraft: the header holds only the payload's size; the words are the engine's
// (engine/remote_drafts.h), opaque here.
StepMessage encode_remote_draft(std::vector<int32_t> words);
// Checks the header (a known kind, sizes that add up to the payload, no negative size) and throws
// m3::Error naming what is wrong: a corrupt message must not become a step.
void check_step_header(const std::array<int64_t, kStepHeaderWords>& header);
StepBatch decode_step(const StepMessage& message);          // any kind but kCopyKvBlocks and kRemoteDraft
KvBlockCopies decode_kv_copies(const StepMessage& message);  // kCopyKvBlocks

// The sampling of a kRemoteSample step: SampleBatch's rows and logprob rows (their bytes: both ends
// run the same build, so the same layout), lists (ids, counts, biases as their bits) and bitmasks,
// and the logits rows to send back.
inline constexpr int kSampleHeaderWords = 9;  // rows, ids, counts, biases, allowed, allowed_words, host rows, logprob rows, payload

struct SampleMessage {
  std::array<int64_t, kSampleHeaderWords> header{};
  std::vector<int32_t> payload;
  int64_t payload_size() const { return header[kSampleHeaderWords - 1]; }
};

// The bitmasks must be filled (wait_masks() first).
SampleMessage encode_sampling(const SampleBatch& sampling, const std::vector<int32_t>& host_rows);
void check_sample_header(const std::array<int64_t, kSampleHeaderWords>& header);
void decode_sampling(const SampleMessage& message, SampleBatch& sampling, std::vector<int32_t>& host_rows);

// The copy's node's answer to a kRemoteSample step (the sampled ids, logprobs and logits rows) or
// to a kRemoteDraft (the drafts' words in `ids`, engine/remote_drafts.h).
struct RemoteReply {
  std::string error;  // empty: the step ran; else why it failed there
  std::vector<int32_t> ids;
  std::vector<RowLogprobs> logprobs;  // travel as their bytes (same build at both ends)
  std::vector<float> host_logits;
  KvCopyTimes kv_copy_times;  // the copy's so far
};

}  // namespace m3
