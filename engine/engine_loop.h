// The engine's single-threaded core: requests in, one step at a time, outputs to sinks. No
// locking: EngineCore runs it on its thread; tests drive it directly, step by step.
//
// Speculative decoding (EngineConfig::speculative): after a step, the drafter proposes up to k
// tokens for each running request that sampled (engine/drafter.h); the next step runs them after
// the request's last token, with a logits row for each, and verification keeps a prefix of them
// plus one token (ops/rejection_sampling.h). The KV of the rejected drafts stays in slots past the
// sequence's computed length, to be overwritten; whole blocks holding only those are given back;
// only committed tokens are ever hashed into the prefix cache. Standard verification of one-hot
// drafts (n-gram, greedy drafters) and synthetic verification use the sampler's draw of every row
// (on the device for a device runner); block verification and probabilistic drafts need the
// target's distributions, so those rows come to the host. A request with structured outputs
// drafts only tokens its constraint allows (cut where it refuses one, or drawn under its masks by
// a drafter that follows constraints), and each verification row is masked as the constraint
// stands after the drafts before it (engine/mask_worker.h). No verification row falls on a forced
// token (the reasoning budget's closer, forced_tokens): drafts stop before them.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/adaptive_verification.h"
#include "engine/drafter.h"
#include "engine/engine_core.h"
#include "engine/kv_manager.h"
#include "engine/mask_worker.h"
#include "engine/sample_rows.h"
#include "engine/scheduler.h"
#include "engine/speculative_verify.h"
#include "engine/step_builder.h"

namespace m3 {

class EngineLoop {
 public:
  // `config.max_model_len` must already be resolved (> 0); requests must be validated. With
  // config.speculative, `drafter` proposes the drafts (null: the runner's own drafter when it has
  // one, ModelRunner::drafter(), else the model-free one the configuration names).
  EngineLoop(ModelRunner& runner, const EngineConfig& config, std::unique_ptr<Drafter> drafter = nullptr);

  void add(EngineRequest request, OutputSink sink, uint64_t seed, Clock::time_point arrival);
  // Frees the request's blocks now and sends its final kAbort output. False for unknown ids.
  bool abort(const std::string& request_id);
  void abort_all();
  bool has_work() const { return scheduler_.has_work(); }
  // One schedule -> forward -> sample -> emit round; nothing happens when there is no work or
  // nothing can be scheduled. Returns whether the model ran (a failed step counts).
  bool step();

  EngineStats stats() const;
  const Scheduler& scheduler() const { return scheduler_; }
  const KvManager& kv() const { return kv_; }

 private:
  struct SeqOutputs;
  void fail_step(const std::vector<ScheduledSeq>& scheduled, const std::string& message);
  // Decides what the runner must give back for scheduled sequence i: its SampleRow (unless the
  // token is forced or none is due), its logprob rows (prompt logprobs, logprobs) and host logits
  // rows (the host's speculative verification).
  void plan_outputs(std::size_t i, Sequence& seq);
  // The logprob rows of the sampling row and its drafts' rows when the request wants logprobs:
  // each asks about the id drawn for it (first_drawn + j, a row of sampling_) and, a draft's row,
  // about its draft; or, first_drawn < 0, about `token` (a forced token).
  void add_logprob_rows(const Sequence& seq, const SeqLogitsRows& rows, int first_drawn, int32_t token,
                        SeqOutputs& out);
  // Appends `sampled` (or the forced token), reports logprobs from logprobs_[logprob_row] (-1 when
  // none were asked for) and checks stop conditions; returns the output for the sink.
  // `mask_error`: the constraint's failure to give this token's mask (the request fails), or null.
  RequestOutput advance(Sequence& seq, int32_t sampled, int logprob_row, const std::string* mask_error);
  // advance()'s work before any token: first-token bookkeeping, max_tokens = 0, prompt logprobs.
  // False when the request finished.
  bool start_output(Sequence& seq, RequestOutput& out);
  // Appends one token (checked) and checks stop conditions; true when the request finished.
  bool append_token(Sequence& seq, int32_t token, int logprob_row, RequestOutput& out);
  // A speculative request after the step: verification, then its kept drafts and next token.
  RequestOutput advance_speculative(Sequence& seq, const SeqLogitsRows& rows, const SeqOutputs& outs);
  // Whether the drafter may guess for this request, and how many tokens at most (0: none).
  int max_drafts(const Sequence& seq) const;
  // The tokens the request may still produce, the next one included (max_tokens, the model's length).
  int remaining_tokens(const Sequence& seq) const;
  // The drafter's guesses for the requests in drafting_ (each after its step's tokens).
  void propose_drafts();
  // Hands the step's constrained rows to the mask worker and makes the batch wait for them.
  void start_masks();
  void collect_prompt_logprobs(Sequence& seq, const SeqLogitsRows& rows, int first_logprob_row);
  void finish(Sequence& seq, RequestOutput& out, FinishReason reason);
  // Calls the sink; on a throwing sink the request is dropped (logged). Removes finished ones.
  // Returns whether the request is still in the engine.
  bool emit(Sequence& seq, const RequestOutput& out);
  RequestOutput make_output(const Sequence& seq) const;

  ModelRunner& runner_;
  EngineConfig config_;
  int vocab_size_;
  KvManager kv_;
  Scheduler scheduler_;
  HostSampler sampler_;
  StepPlan plan_;
  // What the runner returns for the step: sampled ids and only the logits rows needed on the host.
  struct SeqOutputs {
    int sample_index = -1;        // into sampling_.rows / sampled_ (speculative: 1 + drafts rows from it)
    int sample_logprob_row = -1;  // into sampling_.logprobs / logprobs_: the sampling row's (speculative: 1 + drafts)
    int sample_host_row = -1;     // host logits rows of the host's verification (1 + drafts rows)
    int first_prompt_logprob_row = -1;  // into sampling_.logprobs / logprobs_
    int mask_job = -1;            // into mask_jobs_ (a constrained sampling row)
  };
  std::vector<SeqOutputs> outputs_;  // parallel to the schedule
  // Structured outputs: the masks of `seq`'s 1 + drafts.size() rows (its last sampling rows, or the
  // host verifier's), filled beside the forward pass (mask_requests_).
  void add_mask_rows(const Sequence& seq, SeqOutputs& out, std::span<const int32_t> drafts, bool sample_rows);
  SampleBatch sampling_;
  std::vector<int32_t> sampled_;
  // The backend's answers to sampling_.logprobs, then those the host computes from host rows (a
  // host verification's tokens, known only after it).
  std::vector<RowLogprobs> logprobs_;
  std::vector<int32_t> host_rows_;  // indices into plan_.batch.logits_rows
  std::vector<float> logits_;       // [host_rows_.size(), vocab]
  // The step's structured-output masks: the rows' constraints, filled beside the forward pass.
  struct MaskRequest {
    TokenConstraint* constraint;
    int32_t allowed_row;  // the first of 1 + drafts.size() consecutive rows
    int remaining_tokens;
    std::span<const int32_t> drafts;  // a verification's drafts (the sequence's), or empty
  };
  std::vector<MaskRequest> mask_requests_;
  std::vector<MaskWorker::Job> mask_jobs_;
  MaskWorker mask_worker_;
  std::unordered_map<std::string, std::unique_ptr<Sequence>> seqs_;
  uint64_t next_arrival_ = 0;
  EngineStats counters_;  // the monotonic counters; gauges are filled by stats()

  // Speculative decoding (config_.speculative): the drafter, the verification of host rows, and
  // the step's scratch.
  std::unique_ptr<Drafter> owned_drafter_;
  Drafter* drafter_ = nullptr;
  SpeculativeVerifier verifier_;
  std::unordered_map<int32_t, int32_t> draft_counts_;  // output counts with a step's drafts
  std::vector<Sequence*> drafting_;                    // requests to draft for after this step
  std::vector<DraftRequest> draft_requests_;
  std::vector<Draft> drafts_;
  std::vector<int32_t> verified_;
  std::optional<AdaptiveVerification> adaptive_;  // enable_adaptive_verification
};

}  // namespace m3
