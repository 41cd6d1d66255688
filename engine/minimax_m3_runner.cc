#include "engine/minimax_m3_runner.h"

#include <algorithm>

#include "core/error.h"
#include "engine/dspark_blocks.h"
#include "model/dspark.h"
#include "model/minimax_m3.h"
#include "ops/rejection_sampling.h"
#include "parallel/control_group.h"
#include "parallel/rank_workers.h"

namespace m3 {

MiniMaxM3Runner::MiniMaxM3Runner(MiniMaxM3& model) : ranks_{&model} {}

MiniMaxM3Runner::MiniMaxM3Runner(std::vector<MiniMaxM3*> ranks, RankWorkers& workers, ControlGroup* control)
    : ranks_(std::move(ranks)), workers_(&workers), control_(control) {
  M3_CHECK(!control_ || control_->leader(), "the runner drives steps on node 0; a follower node runs node 0's");
  M3_CHECK(!ranks_.empty() && static_cast<int>(ranks_.size()) == workers.size(),
           "{} rank models for {} rank threads", ranks_.size(), workers.size());
  for (const MiniMaxM3* r : ranks_)
    M3_CHECK(r->num_kv_blocks() == ranks_[0]->num_kv_blocks() && r->block_size() == ranks_[0]->block_size(),
             "the ranks' KV pools differ ({} vs {} blocks): the engine's block ids index every rank's pool",
             r->num_kv_blocks(), ranks_[0]->num_kv_blocks());
  for (const MiniMaxM3* r : ranks_)
    M3_CHECK(r->num_host_kv_blocks() == ranks_[0]->num_host_kv_blocks(),
             "the ranks' KV host tiers differ ({} vs {} blocks): the engine's host slots index every rank's tier",
             r->num_host_kv_blocks(), ranks_[0]->num_host_kv_blocks());
}

int MiniMaxM3Runner::block_size() const { return ranks_[0]->block_size(); }
int64_t MiniMaxM3Runner::num_kv_blocks() const { return ranks_[0]->num_kv_blocks(); }
int MiniMaxM3Runner::vocab_size() const { return ranks_[0]->config().vocab_size; }
int64_t MiniMaxM3Runner::max_position_embeddings() const { return ranks_[0]->config().max_position_embeddings; }

namespace {

// engine/drafter.h's view of a DSpark drafter: one block per request, its first drafts, every
// request of the step in one proposal on rank 0's thread.
class DSparkProposer final : public Drafter {
 public:
  DSparkProposer(MiniMaxM3Runner& runner, int block_size, bool probabilistic)
      : runner_(runner), block_size_(block_size), probabilistic_(probabilistic) {}
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override {
    const DSparkBlockSet set = dspark_blocks(requests, block_size_, probabilistic_, /*with_constraints=*/true);
    std::vector<DSparkDrafts> out;
    if (!set.blocks.empty()) out = runner_.propose_dspark(set.blocks);
    take_dspark_drafts(set, out, requests.size(), drafts);
  }
  bool follows_constraints() const override { return true; }

 private:
  MiniMaxM3Runner& runner_;
  int block_size_;
  bool probabilistic_;
};

}  // namespace

MiniMaxM3Runner::~MiniMaxM3Runner() {
  if (dspark_) ranks_[0]->set_taps(nullptr);  // the model may outlive the runner
}

void MiniMaxM3Runner::attach_dspark(std::unique_ptr<DSparkDrafter> drafter, bool probabilistic) {
  // Every tensor-parallel rank holds the whole residual stream after each layer's all-reduce:
  // rank 0's taps are the model's.
  ranks_[0]->set_taps(drafter.get());
  dspark_ = std::move(drafter);
  dspark_proposer_ = std::make_unique<DSparkProposer>(*this, dspark_->config().block_size, probabilistic);
}

std::vector<DSparkDrafts> MiniMaxM3Runner::propose_dspark(std::span<const DSparkBlock> blocks) {
  M3_CHECK(dspark_, "this copy of the model has no DSpark drafter (--speculative-config method dspark)");
  std::vector<DSparkDrafts> out;
  on_rank_zero([&] { out = dspark_->propose(blocks); });
  return out;
}

void MiniMaxM3Runner::on_rank_zero(const std::function<void()>& fn) {
  if (!workers_) return fn();
  workers_->run([&](int r) {
    if (r == 0) fn();
  });
}

void MiniMaxM3Runner::forward(const StepBatch& batch, float* logits) {
  if (!workers_) return ranks_[0]->forward(batch, logits);
  if (control_) control_->announce(StepKind::kForward, batch);
  workers_->run([&](int r) { ranks_[r]->forward(batch, r == 0 ? logits : nullptr); });
}

void MiniMaxM3Runner::forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                                     RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) {
  if (!workers_) return ranks_[0]->forward_sample(batch, sampling, sampled_ids, logprobs, host_rows, host_logits);
  if (control_) control_->announce(StepKind::kForwardSample, batch);
  workers_->run([&](int r) {
    if (r == 0) ranks_[0]->forward_sample(batch, sampling, sampled_ids, logprobs, host_rows, host_logits);
    else ranks_[r]->forward(batch, nullptr);
  });
}

int64_t MiniMaxM3Runner::num_host_kv_blocks() const { return ranks_[0]->num_host_kv_blocks(); }

int64_t MiniMaxM3Runner::kv_block_bytes() const {
  int64_t bytes = dspark_ ? dspark_->kv_block_bytes() : 0;
  for (const MiniMaxM3* r : ranks_) bytes += r->kv_layout().block_bytes;
  return bytes;
}

void MiniMaxM3Runner::copy_kv_blocks(const KvBlockCopies& copies) {
  // The drafter's part of the blocks goes with rank 0's, on its backend.
  if (!workers_) {
    ranks_[0]->copy_kv_blocks(copies);
    if (dspark_) dspark_->copy_blocks(copies);
    return;
  }
  // Every node's ranks hold their shares of the same blocks: the followers copy theirs too.
  if (control_) control_->announce_kv_copies(copies);
  // On each rank's thread: its device is current there (CUDA), and the ranks copy side by side.
  workers_->run([&](int r) {
    ranks_[r]->copy_kv_blocks(copies);
    if (r == 0 && dspark_) dspark_->copy_blocks(copies);
  });
}

KvCopyTimes MiniMaxM3Runner::kv_copy_times() const { return ranks_[0]->kv_copy_times(); }

void MiniMaxM3Runner::idle_step() {
  for (const MiniMaxM3* r : ranks_)
    M3_CHECK(r->attention_data_parallel(), "idle_step: only data-parallel-attention ranks join their peers' steps");
  if (!workers_) return ranks_[0]->idle_step();
  // A copy of several ranks (DEP with -tp > 1): each joins the exchanges of its expert group.
  workers_->run([&](int r) { ranks_[r]->idle_step(); });
}

}  // namespace m3
