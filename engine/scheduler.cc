#include "engine/scheduler.h"

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace m3 {

Scheduler::Scheduler(const SchedulerConfig& config, KvManager& kv) : config_(config), kv_(kv) {
  M3_CHECK(config.max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", config.max_num_seqs);
  M3_CHECK(config.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
           config.max_num_batched_tokens);
  M3_CHECK(config.max_prompt_logprob_rows >= 1, "max_prompt_logprob_rows must be >= 1");
}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::kWaiting;
  waiting_.push_back(seq);
}

int Scheduler::chunk_size(const Sequence& seq, int budget) const {
  int n = seq.num_tokens() - seq.num_computed_tokens;
  if (seq.wants_prompt_logprobs()) n = std::min(n, config_.max_prompt_logprob_rows);
  return std::min(n, budget);
}

bool Scheduler::fits_unchunked(const Sequence& seq, int budget) const {
  return config_.enable_chunked_prefill || chunk_size(seq, INT_MAX) <= budget;
}

void Scheduler::insert_running(Sequence* seq) {
  seq->status = SeqStatus::kRunning;
  const auto pos = std::upper_bound(running_.begin(), running_.end(), seq,
                                    [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  running_.insert(pos, seq);
}

void Scheduler::preempt(Sequence* victim, SchedulerOutput& out, int& budget) {
  auto& sched = out.scheduled;
  const auto it = std::find_if(sched.begin(), sched.end(), [&](const ScheduledSeq& s) { return s.seq == victim; });
  if (it != sched.end()) {
    budget += it->num_new_tokens;
    out.num_tokens -= it->num_new_tokens;
    sched.erase(it);
  }
  kv_.free(*victim);
  victim->draft_tokens.clear();  // recomputed as a prefill, which drafts nothing
  victim->draft_rows.clear();
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  victim->status = SeqStatus::kWaiting;
  if (victim->wants_prompt_logprobs()) victim->prompt_logprobs.clear();  // recomputed from scratch
  waiting_.push_front(victim);
  out.preempted.push_back(victim);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;

  // Running requests: decodes (one token left to compute) first, then prefill chunks.
  for (int pass = 0; pass < 2; ++pass) {
    const bool decode_pass = pass == 0;
    for (std::size_t i = 0; i < running_.size() && budget > 0;) {
      Sequence* seq = running_[i];
      const bool decoding = seq->num_tokens() - seq->num_computed_tokens == 1;
      if (decoding != decode_pass) {
        ++i;
        continue;
      }
      if (!fits_unchunked(*seq, budget)) {
        ++i;
        continue;
      }
      if (decoding && static_cast<int>(seq->draft_tokens.size()) > budget - 1) {
        seq->draft_tokens.resize(static_cast<size_t>(budget - 1));  // the step's budget cuts the guesses
        if (!seq->draft_rows.empty()) seq->draft_rows.resize(seq->draft_tokens.size());
      }
      const int n = decoding ? 1 + static_cast<int>(seq->draft_tokens.size()) : chunk_size(*seq, budget);
      bool self_preempted = false;
      while (!kv_.allocate(*seq, seq->num_computed_tokens + n)) {
        Sequence* victim = running_.back();  // newest arrival
        preempt(victim, out, budget);
        if (victim == seq) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) continue;  // it was the last running request; the loop ends
      out.scheduled.push_back({seq, n});
      out.num_tokens += n;
      budget -= n;
      ++i;
    }
  }
  if (!out.preempted.empty()) return out;  // out of blocks: admit nobody new this step

  while (!waiting_.empty() && budget > 0 && static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const bool first_schedule = seq->num_cached_prompt_tokens < 0;
    const int hit_tokens = seq->wants_prompt_logprobs() ? 0 : kv_.match_prefix(*seq);
    const int n = chunk_size(*seq, budget);
    if (!fits_unchunked(*seq, budget) || !kv_.allocate(*seq, seq->num_computed_tokens + n)) {
      kv_.free(*seq);  // gives the prefix hits back; FCFS: nobody behind it goes first
      break;
    }
    if (first_schedule) {
      seq->num_cached_prompt_tokens = std::min(hit_tokens, seq->num_prompt_tokens);
      prefix_queries_tokens_ += seq->num_prompt_tokens;
      prefix_hits_tokens_ += seq->num_cached_prompt_tokens;
      if (kv_.host_tier()) {
        external_queries_tokens_ += seq->num_prompt_tokens;
        external_hits_tokens_ += std::min(seq->num_offload_hit_tokens, seq->num_cached_prompt_tokens);
      }
    }
    waiting_.pop_front();
    insert_running(seq);
    out.scheduled.push_back({seq, n});
    out.num_tokens += n;
    budget -= n;
  }
  return out;
}

void Scheduler::remove(Sequence* seq) {
  if (seq->status == SeqStatus::kRunning) {
    const auto it = std::find(running_.begin(), running_.end(), seq);
    if (it != running_.end()) running_.erase(it);
  } else if (seq->status == SeqStatus::kWaiting) {
    const auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  kv_.free(*seq);
  seq->status = SeqStatus::kFinished;
}

}  // namespace m3
