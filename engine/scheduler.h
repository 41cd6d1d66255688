// Scheduling policy: which requests run in the next step and how many tokens each computes.
//   1. running requests in decode (1 token each, oldest first; with speculative decoding also
//      the request's drafts, cut to what the step's budget leaves);
//   2. running requests still in prefill (a chunk each, oldest first);
//   3. waiting requests in arrival order (FCFS: a request that does not fit blocks those behind
//      it), first matching the prefix cache, as long as tokens, sequence slots and blocks last.
// All under max_num_batched_tokens and max_num_seqs; with chunked prefill off a request runs only
// when its whole prefill (or prompt-logprobs chunk) fits what is left of the step's tokens. When a running request needs a block and
// none is free, the newest running request is preempted: its blocks are freed, it returns to the
// front of the waiting queue and is recomputed later (prompt + output so far), and no new request
// is admitted in that step.
#pragma once
#include <deque>
#include <vector>

#include "engine/kv_manager.h"
#include "engine/sequence.h"

namespace m3 {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  // Cap on one request's chunk while it collects prompt logprobs: every row of such a chunk
  // needs a full logits row (vocab floats), so the chunk bounds that memory.
  int max_prompt_logprob_rows = 256;
  // Off: a request is scheduled only when all it has left to compute fits this step's budget
  // (a prompt in one step; prompt_logprobs chunks, capped above, each in one step).
  bool enable_chunked_prefill = true;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  // Tokens [num_computed_tokens, + num_new_tokens) run this step; past the sequence's tokens they
  // are its draft_tokens.
  int num_new_tokens = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;  // decodes first, then prefill chunks
  std::vector<Sequence*> preempted;     // preempted during this schedule (now waiting)
  int num_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvManager& kv);

  void add(Sequence* seq);  // a new request: joins the waiting queue's tail
  SchedulerOutput schedule();
  // Removes a request wherever it is (waiting or running) and frees its blocks at once.
  void remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  uint64_t num_preemptions() const { return num_preemptions_; }
  uint64_t prefix_cache_queries_tokens() const { return prefix_queries_tokens_; }
  uint64_t prefix_cache_hits_tokens() const { return prefix_hits_tokens_; }
  // The host tier's share (vllm:external_prefix_cache_*): prompt tokens of requests looked up while
  // the engine has a host tier, and those of them brought back from it, at the first schedule.
  uint64_t external_prefix_cache_queries_tokens() const { return external_queries_tokens_; }
  uint64_t external_prefix_cache_hits_tokens() const { return external_hits_tokens_; }

 private:
  int chunk_size(const Sequence& seq, int budget) const;
  // With chunked prefill off: whether the request's whole next chunk fits `budget`.
  bool fits_unchunked(const Sequence& seq, int budget) const;
  void preempt(Sequence* victim, SchedulerOutput& out, int& budget);
  void insert_running(Sequence* seq);

  SchedulerConfig config_;
  KvManager& kv_;
  std::deque<Sequence*> waiting_;   // arrival order
  std::vector<Sequence*> running_;  // arrival order; holds blocks
  uint64_t num_preemptions_ = 0;
  uint64_t prefix_queries_tokens_ = 0;
  uint64_t prefix_hits_tokens_ = 0;
  uint64_t external_queries_tokens_ = 0;
  uint64_t external_hits_tokens_ = 0;
};

}  // namespace m3
