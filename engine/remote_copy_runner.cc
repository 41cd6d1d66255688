#include "engine/remote_copy_runner.h"

#include <algorithm>
#include <exception>
#include <numeric>

#include "core/error.h"
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
  forward_sample(batch, SampleBatch{}, nullptr, rows, logits);
}

void RemoteCopyRunner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                      const std::vector<int32_t>& host_rows, float* host_logits) {
  const SampleReply reply = channel_.run_remote_sample(batch, sampling, host_rows);
  if (!reply.error.empty())
    fail("copy {} (data-parallel rank {} on node {}): its step failed there: {}", geometry_.copy, geometry_.copy,
         geometry_.node, reply.error);
  const size_t logits = host_rows.size() * static_cast<size_t>(geometry_.vocab_size);
  M3_CHECK(reply.sampled_ids.size() == sampling.rows.size() && reply.host_logits.size() == logits,
           "copy {} on node {}: {} ids and {} logits back for {} rows to sample and {} logits rows", geometry_.copy,
           geometry_.node, reply.sampled_ids.size(), reply.host_logits.size(), sampling.rows.size(), host_rows.size());
  if (sampled_ids) std::copy(reply.sampled_ids.begin(), reply.sampled_ids.end(), sampled_ids);
  if (host_logits) std::copy(reply.host_logits.begin(), reply.host_logits.end(), host_logits);
  kv_copy_times_ = reply.kv_copy_times;
}

void RemoteCopyRunner::idle_step() { channel_.announce(StepKind::kIdleStep, StepBatch{}); }

void RemoteCopyRunner::copy_kv_blocks(const KvBlockCopies& copies) { channel_.announce_kv_copies(copies); }

RemoteCopyCounts serve_remote_copy(ControlGroup& channel, ModelRunner& runner, int copy) {
  RemoteCopyCounts n;
  while (std::optional<NodeCommand> command = channel.next_command()) {
    if (command->kind == StepKind::kRemoteSample) {
      SampleReply reply;
      try {
        reply.sampled_ids.resize(command->sampling.rows.size());
        reply.host_logits.resize(command->host_rows.size() * static_cast<size_t>(runner.vocab_size()));
        runner.forward_sample(command->step, command->sampling, reply.sampled_ids.data(), command->host_rows,
                              reply.host_logits.data());
      } catch (const std::exception& e) {
        reply = SampleReply{};
        reply.error = e.what();
      }
      reply.kv_copy_times = runner.kv_copy_times();
      channel.reply(reply);
      ++n.steps;
      ++n.sampled;
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
