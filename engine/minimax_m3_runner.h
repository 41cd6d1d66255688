// The ModelRunner over the MiniMax-M3 model (model/minimax_m3.h), whole or split over the ranks of
// a tensor-parallel group in this process. The models (and the workers) must outlive the runner
// (and so the EngineCore that owns it):
//   MiniMaxM3 model(...);
//   EngineCore engine(std::make_unique<MiniMaxM3Runner>(model), config);
//
// Split over ranks, every rank runs every step on its own thread (parallel/rank_workers.h), each
// on its partition of the model; the collectives inside the step keep them in lockstep and leave
// every rank with the same full logits, so rank 0 alone copies logits rows out and samples.
//
// Under data-parallel attention (DEP) a runner drives one copy, an engine lane: its one rank, or
// with -tp > 1 its tp ranks on workers of their own, exactly as a tensor-parallel runner does.
//
// On several hosts (--nnodes) the runner of node 0 holds its local ranks and the control group
// (parallel/control_group.h): it announces each step to the other nodes' processes, which run it
// on their ranks, before running it on its own; and so the KV block copies of the host tier.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/drafter.h"
#include "engine/model_runner.h"

namespace m3 {

class ControlGroup;
class DSparkDrafter;
struct DSparkBlock;
struct DSparkDrafts;
class MiniMaxM3;
class RankWorkers;

class MiniMaxM3Runner final : public ModelRunner {
 public:
  explicit MiniMaxM3Runner(MiniMaxM3& model);
  // ranks[r] runs on workers' thread r; ranks.size() == workers.size().
  // control, when given (node 0 of several hosts), hears of every step first.
  MiniMaxM3Runner(std::vector<MiniMaxM3*> ranks, RankWorkers& workers, ControlGroup* control = nullptr);
  int block_size() const override;
  int64_t num_kv_blocks() const override;
  int vocab_size() const override;
  int64_t max_position_embeddings() const override;
  void forward(const StepBatch& batch, float* logits) override;
  // Samples on the model's backend (the CUDA backend: on the GPU, only ids and host_rows copied).
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) override;
  // A data-parallel-attention copy's part of its peers' step (MiniMaxM3::idle_step on each of its
  // ranks).
  void idle_step() override;
  // The host tier: every rank's model holds the same slots of its own share of each block.
  int64_t num_host_kv_blocks() const override;
  int64_t kv_block_bytes() const override;
  void copy_kv_blocks(const KvBlockCopies& copies) override;
  KvCopyTimes kv_copy_times() const override;  // rank 0's (the ranks copy side by side)

  // Speculative decoding with a DSpark drafter on rank 0's backend: rank 0's model feeds its cache
  // from its taps during every forward, and drafter() proposes on rank 0's thread.
  // probabilistic: drafts drawn from the drafter's distribution at the request's temperature
  // (greedy requests still draft greedily), else the Markov head's argmax.
  void attach_dspark(std::unique_ptr<DSparkDrafter> drafter, bool probabilistic = false);
  ~MiniMaxM3Runner() override;
  Drafter* drafter() override { return dspark_proposer_.get(); }
  // The attached drafter's drafts for `blocks`, on rank 0's thread (what drafter() runs; a DEP copy
  // on another host runs it for node 0's blocks, engine/remote_copy_runner.h).
  std::vector<DSparkDrafts> propose_dspark(std::span<const DSparkBlock> blocks);
  // Runs fn on rank 0's thread (where its device is current), or here with one rank.
  void on_rank_zero(const std::function<void()>& fn);
  MiniMaxM3& rank_zero() const { return *ranks_[0]; }

 private:
  std::unique_ptr<DSparkDrafter> dspark_;
  std::unique_ptr<Drafter> dspark_proposer_;
  std::vector<MiniMaxM3*> ranks_;
  RankWorkers* workers_ = nullptr;  // null: one rank, run on the caller's thread
  ControlGroup* control_ = nullptr;  // node 0 of several hosts, else null
};

}  // namespace m3
