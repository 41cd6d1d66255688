#include "engine/remote_copy_runner.h"

#include <algorithm>
#include <exception>
#include <numeric>

#include "core/error.h"
#include "engine/dspark_blocks.h"
#include "parallel/control_group.h"

namespace m3 {

RemoteCopyRunner::RemoteCopyRunner(ControlGroup& channel, RemoteCopyGeometry geometry)
    : channel_(channel), geometry_(geometry) {
  M3_CHECK(channel_.leader() && channel_.num_nodes() == 2,
           "copy {}: node 0 drives a copy on another node over a channel of two", geometry_.copy);
}

void RemoteCopyRunner::forward(const StepBatch& batch, float* logits) {
  std::vector<int32_t> rows(batch.logits_rows.size());
  std::iota(rows.begin(), rows.end(), 0);
  forward_sample(batch, SampleBatch{}, nullptr, nullptr, rows, logits);
}

void RemoteCopyRunner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows,
                                      float* host_logits) {
  const RemoteReply reply = channel_.run_remote_sample(batch, sampling, host_rows);
  if (!reply.error.empty())
    fail("copy {} (data-parallel rank {} on node {}): its step failed there: {}", geometry_.copy, geometry_.copy,
         geometry_.node, reply.error);
  const size_t logits = host_rows.size() * static_cast<size_t>(geometry_.vocab_size);
  M3_CHECK(reply.ids.size() == sampling.rows.size() && reply.logprobs.size() == sampling.logprobs.size() &&
               reply.host_logits.size() == logits,
           "copy {} on node {}: {} ids, {} logprob rows and {} logits back for {} rows to sample, {} logprob rows and "
           "{} logits rows",
           geometry_.copy, geometry_.node, reply.ids.size(), reply.logprobs.size(), reply.host_logits.size(),
           sampling.rows.size(), sampling.logprobs.size(), host_rows.size());
  if (sampled_ids) std::copy(reply.ids.begin(), reply.ids.end(), sampled_ids);
  if (logprobs) std::copy(reply.logprobs.begin(), reply.logprobs.end(), logprobs);
  if (host_logits) std::copy(reply.host_logits.begin(), reply.host_logits.end(), host_logits);
  kv_copy_times_ = reply.kv_copy_times;
}

void RemoteCopyRunner::idle_step() { channel_.announce(StepKind::kIdleStep, StepBatch{}); }

namespace {

// engine/drafter.h's view of the copy's drafter: the step's blocks go over the channel, the drafts
// come back.
class RemoteDSparkProposer final : public Drafter {
 public:
  RemoteDSparkProposer(ControlGroup& channel, const RemoteCopyGeometry& geometry, int block_size, bool probabilistic)
      : channel_(channel), geometry_(geometry), block_size_(block_size), probabilistic_(probabilistic) {}
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override {
    const DSparkBlockSet set = dspark_blocks(requests, block_size_, probabilistic_, /*with_constraints=*/false);
    std::vector<DSparkDrafts> out;
    if (!set.blocks.empty()) {
      const RemoteReply reply = channel_.run_remote_draft(encode_dspark_blocks(set));
      if (!reply.error.empty())
        fail("copy {} (data-parallel rank {} on node {}): its drafter failed there: {}", geometry_.copy,
             geometry_.copy, geometry_.node, reply.error);
      out = decode_dspark_drafts(reply.ids, set.blocks.size());
    }
    take_dspark_drafts(set, out, requests.size(), drafts);
  }

 private:
  ControlGroup& channel_;
  const RemoteCopyGeometry& geometry_;
  int block_size_;
  bool probabilistic_;
};

}  // namespace

void RemoteCopyRunner::attach_dspark(int block_size, bool probabilistic) {
  drafter_ = std::make_unique<RemoteDSparkProposer>(channel_, geometry_, block_size, probabilistic);
}

void RemoteCopyRunner::copy_kv_blocks(const KvBlockCopies& copies) { channel_.announce_kv_copies(copies); }

namespace {

// Answers a call of node 0's with fill's reply, or with the error fill threw: node 0 fails that
// call's requests and the copy serves on.
void answer(ControlGroup& channel, const ModelRunner& runner, const std::function<void(RemoteReply&)>& fill) {
  RemoteReply reply;
  try {
    fill(reply);
  } catch (const std::exception& e) {
    reply = RemoteReply{};
    reply.error = e.what();
  }
  reply.kv_copy_times = runner.kv_copy_times();
  channel.reply(reply);
}

}  // namespace

RemoteCopyCounts serve_remote_copy(ControlGroup& channel, ModelRunner& runner, int copy, const RemoteDraftFn& draft) {
  RemoteCopyCounts n;
  while (std::optional<NodeCommand> command = channel.next_command()) {
    if (command->kind == StepKind::kRemoteSample) {
      answer(channel, runner, [&](RemoteReply& reply) {
        reply.ids.resize(command->sampling.rows.size());
        reply.logprobs.resize(command->sampling.logprobs.size());
        reply.host_logits.resize(command->host_rows.size() * static_cast<size_t>(runner.vocab_size()));
        runner.forward_sample(command->step, command->sampling, reply.ids.data(), reply.logprobs.data(),
                              command->host_rows, reply.host_logits.data());
      });
      ++n.steps;
      ++n.sampled;
      continue;
    }
    if (command->kind == StepKind::kRemoteDraft) {
      // A drafter's failure is node 0's requests' (they decode without drafts), not the copy's.
      answer(channel, runner, [&](RemoteReply& reply) {
        M3_CHECK(draft, "node {}: copy {} has no DSpark drafter (node 0 and this node were started with "
                        "different --speculative-config?)",
                 channel.node_rank(), copy);
        const DSparkBlockSet set = decode_dspark_blocks(command->words);
        reply.ids = encode_dspark_drafts(draft(set.blocks));
      });
      ++n.drafts;
      continue;
    }
    try {
      if (command->kind == StepKind::kCopyKvBlocks) {
        runner.copy_kv_blocks(command->copies);
      } else if (command->kind == StepKind::kIdleStep) {
        runner.idle_step();
        ++n.steps;
      } else {
        fail("a step of kind {} on a copy's channel", static_cast<int64_t>(command->kind));
      }
    } catch (const Error& e) {
      fail("node {}: copy {}: {} from node 0 failed after {} steps (node 0 or another node lost, or a rank "
           "failed): {}",
           channel.node_rank(), copy, command->kind == StepKind::kCopyKvBlocks ? "the KV copies" : "an idle step",
           n.steps, e.what());
    }
  }
  return n;
}

}  // namespace m3
