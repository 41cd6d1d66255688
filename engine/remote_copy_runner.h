// The runner of a data-parallel copy (DEP) whose ranks live on another host (--nnodes): node 0's
// engine lane for that copy schedules and samples-for as any lane does, but the step runs there.
// Each call goes over the copy's channel (a control group of node 0 and the copy's node,
// parallel/control_group.h): forward_sample sends the step and its sampling and waits for the
// sampled ids and logits rows; idle_step and copy_kv_blocks are announced and run there; so are the
// proposals of the copy's DSpark drafter.
// serve_remote_copy is the other end: the copy's node (app/node_follower) runs them on its own
// runner (a MiniMaxM3Runner over the copy's ranks).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "engine/model_runner.h"

namespace m3 {

class ControlGroup;
struct DSparkBlock;
struct DSparkDrafts;

// What node 0 knows of the copy without asking: the same plan made the same pools everywhere.
struct RemoteCopyGeometry {
  int block_size = 0;
  int64_t num_kv_blocks = 0;
  int vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t num_host_kv_blocks = 0;
  int64_t kv_block_bytes = 0;  // the copy's ranks' shares of a block together
  int copy = 0;                // its data-parallel rank, and the node holding it (for messages)
  int node = 0;
};

class RemoteCopyRunner final : public ModelRunner {
 public:
  // The channel must outlive the runner.
  RemoteCopyRunner(ControlGroup& channel, RemoteCopyGeometry geometry);

  int block_size() const override { return geometry_.block_size; }
  int64_t num_kv_blocks() const override { return geometry_.num_kv_blocks; }
  int vocab_size() const override { return geometry_.vocab_size; }
  int64_t max_position_embeddings() const override { return geometry_.max_position_embeddings; }
  // All of the batch's logits rows, through forward_sample with nothing to sample.
  void forward(const StepBatch& batch, float* logits) override;
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) override;
  void idle_step() override;
  int64_t num_host_kv_blocks() const override { return geometry_.num_host_kv_blocks; }
  int64_t kv_block_bytes() const override { return geometry_.kv_block_bytes; }
  void copy_kv_blocks(const KvBlockCopies& copies) override;
  // As of the copy's last reply.
  KvCopyTimes kv_copy_times() const override { return kv_copy_times_; }
  // Speculative decoding with the copy's DSpark drafter, which runs there (its cache lives beside
  // the copy's pool): drafter() sends each proposal's blocks over the channel. Its drafts are not
  // drawn under structured-output masks (constraints stay on node 0; the engine cuts the drafts
  // they refuse). block_size: the drafter's (dspark_block_size).
  void attach_dspark(int block_size, bool probabilistic);
  Drafter* drafter() override { return drafter_.get(); }

 private:
  ControlGroup& channel_;
  RemoteCopyGeometry geometry_;
  KvCopyTimes kv_copy_times_;
  std::unique_ptr<Drafter> drafter_;
};

// The copy's node: runs node 0's commands from `channel` on `runner` until node 0 says stop.
// Every step to sample is answered, a failed one with its error, so node 0's lane fails that
// step's requests instead of waiting; a failed idle step or copy throws m3::Error naming the
// node and the copy (node 0 then sees that step's collectives fail).
struct RemoteCopyCounts {
  int64_t steps = 0;    // idle ones included
  int64_t sampled = 0;  // with requests of this copy's
  int64_t drafts = 0;   // proposals of the copy's drafter
};
// `draft`: the copy's DSpark drafter (MiniMaxM3Runner::propose_dspark), empty when it has none
// (node 0's proposals are then answered with an error, and its requests decode without drafts).
using RemoteDraftFn = std::function<std::vector<DSparkDrafts>(std::span<const DSparkBlock>)>;
RemoteCopyCounts serve_remote_copy(ControlGroup& channel, ModelRunner& runner, int copy,
                                   const RemoteDraftFn& draft = {});

}  // namespace m3
