#include "engine/engine_loop.h"

#include <algorithm>
#include <climits>
#include <exception>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace m3 {
namespace {

SchedulerConfig scheduler_config(const EngineConfig& config) {
  SchedulerConfig out;
  out.max_num_seqs = config.max_num_seqs;
  out.max_num_batched_tokens = config.max_num_batched_tokens;
  out.enable_chunked_prefill = config.enable_chunked_prefill;
  return out;
}

// The most blocks one step can take from the pool: its token budget in blocks, plus a partly
// filled block per sequence. The host tier saves that many ahead of their eviction.
int64_t save_ahead_blocks(const EngineConfig& config, int block_size) {
  return (config.max_num_batched_tokens + block_size - 1) / block_size + config.max_num_seqs;
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

bool output_ends_with(const Sequence& seq, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  return seq.num_output_tokens() >= n && std::equal(ids.begin(), ids.end(), seq.tokens.end() - n);
}

// The forced token at the next output index, or -1 to sample: the reasoning closer once the
// reasoning budget is spent (unless the reasoning had ended by then), then forced_tokens.
int32_t forced_token(const Sequence& seq) {
  const SamplingParams& p = seq.params();
  const int index = seq.num_output_tokens();
  if (p.reasoning_budget >= 0 && (seq.reasoning_ended_at < 0 || seq.reasoning_ended_at > p.reasoning_budget)) {
    const int i = index - p.reasoning_budget;
    if (i >= 0 && i < static_cast<int>(p.reasoning_end.size())) return p.reasoning_end[i];
  }
  const std::vector<int32_t>& forced = p.forced_tokens;
  if (seq.forced_start < 0) return -1;
  const int i = index - seq.forced_start;
  return i >= 0 && i < static_cast<int>(forced.size()) ? forced[i] : -1;
}

// After a token is appended: the output now ending with forced_after starts the forced tokens;
// the output ending with reasoning_end ends the reasoning.
void note_forced_trigger(Sequence& seq) {
  const SamplingParams& p = seq.params();
  if (p.reasoning_budget >= 0 && seq.reasoning_ended_at < 0 && output_ends_with(seq, p.reasoning_end)) {
    seq.reasoning_ended_at = seq.num_output_tokens();
  }
  if (p.forced_tokens.empty() || seq.forced_start >= 0) return;
  if (output_ends_with(seq, p.forced_after)) seq.forced_start = seq.num_output_tokens();
}

// The sampler's view of a sequence before its next token.
SamplingState sampling_state(const Sequence& seq) {
  SamplingState state;
  state.params = &seq.params();
  state.seed = seq.seed;
  state.output_index = seq.num_output_tokens();
  state.prompt_token_set = seq.prompt_token_set;
  state.output_counts = &seq.output_counts;
  state.min_tokens_masked = seq.min_tokens_masked;
  return state;
}

}  // namespace

EngineLoop::EngineLoop(ModelRunner& runner, const EngineConfig& config, std::unique_ptr<Drafter> drafter)
    : runner_(runner),
      config_(config),
      vocab_size_(runner.vocab_size()),
      kv_(runner.num_kv_blocks(), runner.block_size(), config.enable_prefix_caching, runner.num_host_kv_blocks(),
          save_ahead_blocks(config, runner.block_size())),
      scheduler_(scheduler_config(config), kv_) {
  if (config_.speculative) {
    if (drafter) owned_drafter_ = std::move(drafter);
    else if (config_.speculative->method == "ngram") owned_drafter_ = make_model_free_drafter(*config_.speculative);
    drafter_ = owned_drafter_ ? owned_drafter_.get() : runner_.drafter();
    if (config_.speculative->adaptive_verification) {
      adaptive_.emplace();
      counters_.spec_adaptive_verification = true;
    }
    M3_CHECK(drafter_, "--speculative-config: method {} drafts with a model the runner holds, and it holds none",
             config_.speculative->method);
    counters_.spec_accepted_per_pos.assign(static_cast<size_t>(config_.speculative->num_speculative_tokens), 0);
  }
}

void EngineLoop::add(EngineRequest request, OutputSink sink, uint64_t seed, Clock::time_point arrival) {
  auto seq = std::make_unique<Sequence>();
  seq->request = std::move(request);
  seq->sink = std::move(sink);
  seq->arrival_order = next_arrival_++;
  seq->seed = seed;
  seq->arrival_time = arrival;
  seq->tokens = std::move(seq->request.prompt_token_ids);  // one copy of a long prompt, not two
  seq->num_prompt_tokens = seq->num_tokens();
  const SamplingParams& p = seq->params();
  if (p.repetition_penalty != 1.0f) {
    seq->prompt_token_set = seq->tokens;
    std::sort(seq->prompt_token_set.begin(), seq->prompt_token_set.end());
    seq->prompt_token_set.erase(std::unique(seq->prompt_token_set.begin(), seq->prompt_token_set.end()),
                                seq->prompt_token_set.end());
  }
  if (p.min_tokens > 0) {
    seq->min_tokens_masked = p.stop_token_ids;
    if (!p.ignore_eos) {
      seq->min_tokens_masked.insert(seq->min_tokens_masked.end(), seq->request.eos_token_ids.begin(),
                                    seq->request.eos_token_ids.end());
    }
  }
  if (!p.forced_tokens.empty() && p.forced_after.empty()) seq->forced_start = 0;
  if (p.constraint) seq->constraint = p.constraint->start();
  kv_.update_hashes(*seq);
  Sequence* raw = seq.get();
  const std::string id = raw->request.id;
  M3_CHECK(seqs_.emplace(id, std::move(seq)).second, "request {}: duplicate request id", id);
  scheduler_.add(raw);
}

bool EngineLoop::abort(const std::string& request_id) {
  const auto it = seqs_.find(request_id);
  if (it == seqs_.end()) return false;
  Sequence& seq = *it->second;
  RequestOutput out = make_output(seq);
  finish(seq, out, FinishReason::kAbort);
  emit(seq, out);
  return true;
}

void EngineLoop::abort_all() {
  std::vector<Sequence*> all;
  for (auto& [id, seq] : seqs_) all.push_back(seq.get());
  std::sort(all.begin(), all.end(), [](const Sequence* a, const Sequence* b) { return a->arrival_order < b->arrival_order; });
  for (Sequence* seq : all) abort(seq->request.id);
}

RequestOutput EngineLoop::make_output(const Sequence& seq) const {
  RequestOutput out;
  out.request_id = seq.request.id;
  out.num_prompt_tokens = seq.num_prompt_tokens;
  out.num_cached_prompt_tokens = std::max(0, seq.num_cached_prompt_tokens);
  return out;
}

void EngineLoop::finish(Sequence& seq, RequestOutput& out, FinishReason reason) {
  scheduler_.remove(&seq);  // frees the blocks now
  out.finished = true;
  out.finish_reason = reason;
  if (seq.wants_prompt_logprobs() && reason != FinishReason::kAbort && reason != FinishReason::kError) {
    out.prompt_logprobs = std::move(seq.prompt_logprobs);
    seq.prompt_logprobs_sent = true;
  }
  const Clock::time_point now = Clock::now();
  RequestTimings timings;
  if (seq.first_scheduled_time) timings.queue_s = seconds_between(seq.arrival_time, *seq.first_scheduled_time);
  if (seq.first_token_time) timings.ttft_s = seconds_between(seq.arrival_time, *seq.first_token_time);
  if (seq.first_scheduled_time && seq.first_token_time) {
    timings.prefill_s = seconds_between(*seq.first_scheduled_time, *seq.first_token_time);
    timings.decode_s = seconds_between(*seq.first_token_time, seq.last_token_time.value_or(*seq.first_token_time));
    timings.inference_s = timings.prefill_s + timings.decode_s;
  }
  timings.e2e_s = seconds_between(seq.arrival_time, now);
  out.timings = timings;
  switch (reason) {
    case FinishReason::kStop: ++counters_.finished_stop; break;
    case FinishReason::kLength: ++counters_.finished_length; break;
    case FinishReason::kAbort: ++counters_.finished_abort; break;
    case FinishReason::kError: ++counters_.finished_error; break;
    case FinishReason::kNone: break;
  }
}

bool EngineLoop::emit(Sequence& seq, const RequestOutput& out) {
  bool drop = out.finished;
  try {
    if (seq.sink) seq.sink(out);
  } catch (const std::exception& e) {
    M3_LOG_ERROR("request {}: output sink threw ({}); dropping the request", seq.request.id, e.what());
    if (!out.finished) {
      scheduler_.remove(&seq);
      ++counters_.finished_abort;
    }
    drop = true;
  }
  if (drop) seqs_.erase(seq.request.id);  // destroys seq
  return !drop;
}

void EngineLoop::fail_step(const std::vector<ScheduledSeq>& scheduled, const std::string& message) {
  for (const ScheduledSeq& s : scheduled) {
    Sequence& seq = *s.seq;
    RequestOutput out = make_output(seq);
    out.error = message;
    finish(seq, out, FinishReason::kError);
    emit(seq, out);
  }
}

void EngineLoop::collect_prompt_logprobs(Sequence& seq, const SeqLogitsRows& rows, int first_logprob_row) {
  for (int j = 0; j < rows.num_prompt_rows; ++j) {
    const int pos = rows.first_prompt_pos + j;
    seq.prompt_logprobs.push_back(position_logprobs(logprobs_[first_logprob_row + j], seq.tokens[pos + 1]));
  }
}

void EngineLoop::add_logprob_rows(const Sequence& seq, const SeqLogitsRows& rows, int first_drawn, int32_t token,
                                  SeqOutputs& out) {
  const int top_k = seq.params().logprobs;
  if (top_k < 0) return;
  out.sample_logprob_row = static_cast<int>(sampling_.logprobs.size());
  for (int j = 0; j <= rows.num_drafts; ++j) {
    LogprobRow q;
    q.logits_row = rows.sample_row + j;
    q.top_k = top_k;
    if (first_drawn < 0) {
      q.token[0] = token;
    } else {
      q.drawn_by[0] = first_drawn + j;  // the row's own draw: a rejected draft's replacement, or the bonus token
      if (j < rows.num_drafts) q.token[1] = seq.draft_tokens[static_cast<size_t>(j)];
    }
    sampling_.logprobs.push_back(q);
  }
}

void EngineLoop::plan_outputs(std::size_t i, Sequence& seq) {
  const SeqLogitsRows& rows = plan_.rows[i];
  SeqOutputs& out = outputs_[i];
  out = SeqOutputs();
  if (rows.num_prompt_rows > 0) {
    out.first_prompt_logprob_row = static_cast<int>(sampling_.logprobs.size());
    for (int j = 0; j < rows.num_prompt_rows; ++j) {
      LogprobRow q;
      q.logits_row = rows.first_prompt_row + j;
      q.top_k = seq.params().prompt_logprobs;
      q.token[0] = seq.tokens[static_cast<size_t>(rows.first_prompt_pos + j + 1)];
      sampling_.logprobs.push_back(q);
    }
  }
  // advance() appends nothing once max_tokens is reached (max_tokens = 0: the prompt alone).
  if (rows.sample_row < 0 || seq.num_output_tokens() >= seq.params().max_tokens) return;
  const int k = rows.num_drafts;
  // Block verification and probabilistic drafts verify on the host, from the target's rows.
  const bool host_verify = k > 0 && (config_.speculative->rejection == RejectionMethod::kBlock || !seq.draft_rows.empty());
  if (host_verify) {  // its logprobs too: the host computes them from these rows once it has the tokens
    out.sample_host_row = static_cast<int>(host_rows_.size());
    for (int j = 0; j <= k; ++j) host_rows_.push_back(rows.sample_row + j);
    if (seq.constraint)  // the host verifier masks the rows itself
      add_mask_rows(seq, out, std::span<const int32_t>(seq.draft_tokens.data(), k), false);
    return;
  }
  if (const int32_t forced = forced_token(seq); forced >= 0) {
    add_logprob_rows(seq, rows, -1, forced, out);
    return;
  }
  out.sample_index = static_cast<int>(sampling_.rows.size());
  add_logprob_rows(seq, rows, out.sample_index, -1, out);
  if (k > 0) {
    // Row j is drawn at output index + j with drafts [0, j) counted as outputs (penalties).
    SamplingState state = sampling_state(seq);
    const bool penalised = sample_row_penalised(sample_row_params(state, 0));
    if (penalised) {
      draft_counts_ = seq.output_counts;
      state.output_counts = &draft_counts_;
    }
    for (int j = 0; j <= k; ++j) {
      state.output_index = seq.num_output_tokens() + j;
      add_sample_row(sampling_, rows.sample_row + j, state);
      if (penalised && j < k) ++draft_counts_[seq.draft_tokens[static_cast<size_t>(j)]];
    }
    if (seq.constraint) add_mask_rows(seq, out, std::span<const int32_t>(seq.draft_tokens.data(), k), true);
    return;
  }
  add_sample_row(sampling_, rows.sample_row, sampling_state(seq));
  if (seq.constraint) add_mask_rows(seq, out, {}, true);
}

void EngineLoop::add_mask_rows(const Sequence& seq, SeqOutputs& out, std::span<const int32_t> drafts,
                               bool sample_rows) {
  // 1 + drafts.size() masks, mask j the constraint's after drafts [0, j); sample_rows: they are
  // the last sampling rows' masks (else the host verifier reads them).
  const size_t rows = drafts.size() + 1, first = sampling_.rows.size() - (sample_rows ? rows : 0);
  int32_t allowed_row = -1;
  for (size_t j = 0; j < rows; ++j) {
    const int32_t row = sampling_.add_allowed_row(token_mask_words(vocab_size_));
    if (j == 0) allowed_row = row;
    if (sample_rows) sampling_.rows[first + j].allowed_row = row;
  }
  out.mask_job = static_cast<int>(mask_requests_.size());
  mask_requests_.push_back({seq.constraint.get(), allowed_row, remaining_tokens(seq), drafts});
}

void EngineLoop::start_masks() {
  mask_jobs_.clear();
  if (mask_requests_.empty()) return;
  const auto words = static_cast<size_t>(sampling_.allowed_words);
  for (const MaskRequest& m : mask_requests_) {
    MaskWorker::Job job;
    job.constraint = m.constraint;
    job.words = std::span<uint32_t>(sampling_.allowed.data() + static_cast<size_t>(m.allowed_row) * words,
                                    words * (m.drafts.size() + 1));
    job.remaining_tokens = m.remaining_tokens;
    job.drafts = m.drafts;
    mask_jobs_.push_back(std::move(job));
  }
  mask_worker_.start(&mask_jobs_);
  sampling_.masks_ready = [this] { mask_worker_.wait(); };
}

bool EngineLoop::start_output(Sequence& seq, RequestOutput& out) {
  const bool first_token = !seq.first_token_time.has_value();
  if (first_token) {
    seq.first_token_time = Clock::now();
    counters_.prompt_tokens_total += seq.num_prompt_tokens;
  }
  if (seq.num_output_tokens() >= seq.params().max_tokens) {  // max_tokens = 0: the prompt was all we ran
    finish(seq, out, FinishReason::kLength);
    return false;
  }
  if (seq.wants_prompt_logprobs()) {
    out.prompt_logprobs = std::move(seq.prompt_logprobs);
    seq.prompt_logprobs.clear();
    seq.prompt_logprobs_sent = true;
  }
  return true;
}

bool EngineLoop::append_token(Sequence& seq, int32_t token, int logprob_row, RequestOutput& out) {
  const SamplingParams& p = seq.params();
  if (token < 0 || token >= vocab_size_) {  // a runner that broke its contract: fail this request only
    out.error = "sampling returned token " + std::to_string(token) + " outside the vocabulary";
    finish(seq, out, FinishReason::kError);
    return true;
  }
  if (seq.constraint && !seq.constraint->accept(token)) {
    out.error = "structured output: token " + std::to_string(token) + " does not continue the constrained text";
    finish(seq, out, FinishReason::kError);
    return true;
  }
  if (p.logprobs >= 0) {
    M3_CHECK(logprob_row >= 0 && static_cast<size_t>(logprob_row) < logprobs_.size(),
             "request {}: no logprobs were computed for its token", seq.request.id);
    out.logprobs.push_back(position_logprobs(logprobs_[static_cast<size_t>(logprob_row)], token));
  }

  seq.tokens.push_back(token);
  seq.last_token_time = Clock::now();
  note_forced_trigger(seq);
  ++seq.output_counts[token];
  kv_.update_hashes(seq);
  ++counters_.generation_tokens_total;
  out.new_token_ids.push_back(token);

  const int num_output = seq.num_output_tokens();
  if (num_output >= p.min_tokens &&
      ((!p.ignore_eos && contains(seq.request.eos_token_ids, token)) || contains(p.stop_token_ids, token))) {
    out.stop_token_id = token;
    finish(seq, out, FinishReason::kStop);
  } else if (seq.constraint && seq.constraint->terminated()) {  // complete: nothing may follow
    finish(seq, out, FinishReason::kStop);
  } else if (num_output >= p.max_tokens || seq.num_tokens() >= config_.max_model_len) {
    finish(seq, out, FinishReason::kLength);
  } else {
    return false;
  }
  return true;
}

RequestOutput EngineLoop::advance(Sequence& seq, int32_t sampled, int logprob_row, const std::string* mask_error) {
  RequestOutput out = make_output(seq);
  if (!start_output(seq, out)) return out;
  if (mask_error && !mask_error->empty()) {  // the constraint could not say what may come next
    out.error = *mask_error;
    finish(seq, out, FinishReason::kError);
    return out;
  }
  const int32_t forced = forced_token(seq);
  append_token(seq, forced >= 0 ? forced : sampled, logprob_row, out);
  return out;
}

RequestOutput EngineLoop::advance_speculative(Sequence& seq, const SeqLogitsRows& rows, const SeqOutputs& outs) {
  const SpeculativeConfig& spec = *config_.speculative;
  const auto k = static_cast<size_t>(rows.num_drafts);
  const std::span<const int32_t> drafts(seq.draft_tokens.data(), k);
  const std::span<const float> rates =
      spec.rejection == RejectionMethod::kSynthetic ? std::span<const float>(spec.synthetic_rates).first(k)
                                                    : std::span<const float>();
  const float* host_rows =
      outs.sample_host_row >= 0 ? logits_.data() + static_cast<std::size_t>(outs.sample_host_row) * vocab_size_ : nullptr;
  RequestOutput out = make_output(seq);
  if (outs.mask_job >= 0 && !mask_jobs_[outs.mask_job].error.empty()) {  // the constraint could not go on
    if (!start_output(seq, out)) return out;
    out.error = mask_jobs_[outs.mask_job].error;
    finish(seq, out, FinishReason::kError);
    return out;
  }
  verified_.clear();
  try {
    if (outs.sample_index >= 0) {
      const std::span<const int32_t> sampled(sampled_.data() + outs.sample_index, k + 1);
      const int32_t kept = accept_sampled(spec.rejection, drafts, sampled, rates, seq.seed, seq.num_output_tokens());
      verified_.assign(drafts.begin(), drafts.begin() + kept);
      verified_.push_back(sampled[static_cast<size_t>(kept)]);
    } else {
      const SamplingState state = sampling_state(seq);
      SpeculativeStep step;
      step.state = &state;
      step.logits = std::span<const float>(host_rows, (k + 1) * static_cast<std::size_t>(vocab_size_));
      step.vocab = vocab_size_;
      step.drafts = drafts;
      if (!seq.draft_rows.empty()) step.draft_rows = std::span<const TokenDistribution>(seq.draft_rows).first(k);
      step.method = spec.rejection;
      step.synthetic_rates = rates;
      if (outs.mask_job >= 0) {
        const auto words = static_cast<size_t>(sampling_.allowed_words);
        step.allowed = std::span<const uint32_t>(
            sampling_.allowed.data() + static_cast<size_t>(mask_requests_[outs.mask_job].allowed_row) * words,
            (k + 1) * words);
        step.allowed_words = sampling_.allowed_words;
      }
      verified_ = verifier_.verify(step).tokens;
    }
  } catch (const std::exception& e) {
    out.error = std::string("speculative verification: ") + e.what();
    finish(seq, out, FinishReason::kError);
    return out;
  }
  const size_t kept = verified_.size() - 1;
  ++counters_.spec_num_drafts;
  counters_.spec_num_draft_tokens += k;
  counters_.spec_num_accepted_tokens += kept;
  for (size_t j = 0; j < kept; ++j) ++counters_.spec_accepted_per_pos[j];

  if (!start_output(seq, out)) return out;
  int first_logprob_row = outs.sample_logprob_row;
  if (host_rows && seq.params().logprobs >= 0) {
    // The host verifier's tokens are known only now: their logprobs from its rows, the rows side
    // by side (a 200K-token row is ~1 ms on one core); a row's answer does not depend on the thread.
    first_logprob_row = static_cast<int>(logprobs_.size());
    logprobs_.resize(logprobs_.size() + verified_.size());
    const auto score = [&](std::size_t j) {
      const int32_t tokens[2] = {verified_[j], -1};
      row_logprobs_reference(host_rows + j * static_cast<std::size_t>(vocab_size_), vocab_size_,
                             seq.params().logprobs, tokens, logprobs_[static_cast<std::size_t>(first_logprob_row) + j]);
    };
    if (verified_.size() > 1 && verified_.size() * static_cast<std::size_t>(vocab_size_) >= (1u << 19)) {
      std::vector<std::jthread> pool;  // joined on leaving the block
      for (std::size_t j = 1; j < verified_.size(); ++j) pool.emplace_back(score, j);
      score(0);
    } else {
      for (std::size_t j = 0; j < verified_.size(); ++j) score(j);
    }
  }
  for (size_t j = 0; j < verified_.size(); ++j) {
    const int logprob_row = first_logprob_row >= 0 ? first_logprob_row + static_cast<int>(j) : -1;
    if (append_token(seq, verified_[j], logprob_row, out)) return out;
  }
  // The last token and the kept drafts have their KV; the blocks past the text held only
  // rejected drafts.
  seq.num_computed_tokens = seq.num_tokens() - 1;
  kv_.commit_computed(seq);
  kv_.trim(seq, seq.num_tokens());
  return out;
}

namespace {

// How many of `drafts` the constraint accepts in order (none after one that completes the output);
// the constraint is left as it was.
size_t allowed_prefix(TokenConstraint& constraint, std::span<const int32_t> drafts) {
  DraftConstraintWalk walk(constraint, 0);
  for (const int32_t token : drafts)
    if (walk.terminated() || !walk.accept(token)) break;
  return static_cast<size_t>(walk.accepted());
}

// How many outputs from the next one on are sure not to be forced, judging by the output so far
// (INT_MAX when none can be). A verification row on a forced index would be sampled instead.
int unforced_run(const Sequence& seq) {
  const SamplingParams& p = seq.params();
  const int index = seq.num_output_tokens();
  int run = INT_MAX;
  // The reasoning closer at [budget, budget + closer) unless the reasoning ended before the budget.
  const int budget = p.reasoning_budget, closer = static_cast<int>(p.reasoning_end.size());
  if (budget >= 0 && (seq.reasoning_ended_at < 0 || seq.reasoning_ended_at > budget) && index < budget + closer)
    run = std::max(0, budget - index);
  // forced_tokens once forced_after has appeared: any token may complete forced_after, so a
  // request drafts only once its forced tokens are behind it.
  if (!p.forced_tokens.empty()) {
    if (seq.forced_start < 0) return 0;
    if (index < seq.forced_start + static_cast<int>(p.forced_tokens.size()))
      run = std::min(run, std::max(0, seq.forced_start - index));
  }
  return run;
}

}  // namespace

int EngineLoop::max_drafts(const Sequence& seq) const {
  if (!drafter_ || seq.status != SeqStatus::kRunning || seq.num_tokens() - seq.num_computed_tokens != 1) return 0;
  const SamplingParams& p = seq.params();
  // A constrained request's drafts are cut where the constraint refuses one (propose_drafts),
  // which leaves the output the target's only for drafts that do not depend on the draws:
  // probabilistic drafts of a sampled request would not be (the cut changes their distribution),
  // unless the drafter draws them under the constraint's masks, when nothing is cut.
  const SpeculativeConfig& spec = *config_.speculative;
  if (seq.constraint && spec.probabilistic_drafts && !p.greedy() && !drafter_->follows_constraints()) return 0;
  // Every draft kept plus the token after them must fit max_tokens and the model's length, and
  // none of their rows may fall on a forced token (the reasoning budget's closer, forced_tokens).
  const int room = std::min(remaining_tokens(seq), unforced_run(seq)) - 1;
  return std::max(0, std::min(config_.speculative->num_speculative_tokens, room));
}

int EngineLoop::remaining_tokens(const Sequence& seq) const {
  return std::min(seq.params().max_tokens - seq.num_output_tokens(), config_.max_model_len - seq.num_tokens());
}

void EngineLoop::propose_drafts() {
  if (drafting_.empty()) return;
  const std::optional<int>& limit = config_.speculative->disable_by_batch_size;
  if (limit && static_cast<int>(scheduler_.running().size()) > *limit) {
    drafting_.clear();  // a full batch verifies more than the kept drafts bring
    return;
  }
  draft_requests_.clear();
  for (Sequence* seq : drafting_)
    draft_requests_.push_back({seq->tokens, max_drafts(*seq), seq->block_table, &seq->params(), seq->seed,
                               seq->num_output_tokens(), seq->constraint.get(), remaining_tokens(*seq)});
  try {
    drafter_->propose(draft_requests_, drafts_);
  } catch (const std::exception& e) {
    // No drafts is always correct: the requests decode one token a step until the drafter works.
    M3_LOG_ERROR("drafter failed for {} request(s): {}", drafting_.size(), e.what());
    drafts_.assign(drafting_.size(), Draft());
  }
  if (adaptive_) adaptive_->begin_proposal();
  for (size_t i = 0; i < drafting_.size(); ++i) {
    std::vector<int32_t>& d = drafts_[i].tokens;
    std::vector<TokenDistribution>& rows = drafts_[i].rows;
    if (static_cast<int>(d.size()) > draft_requests_[i].max_drafts) d.resize(static_cast<size_t>(draft_requests_[i].max_drafts));
    // Out-of-vocabulary guesses are cut there: the model must never see them.
    const auto bad = std::find_if(d.begin(), d.end(), [&](int32_t t) { return t < 0 || t >= vocab_size_; });
    d.erase(bad, d.end());
    if (!rows.empty() && rows.size() < d.size()) d.resize(rows.size());  // a draft without its row is not usable
    if (TokenConstraint* constraint = drafting_[i]->constraint.get())
      d.resize(allowed_prefix(*constraint, d));  // the grammar's text: a draft past it is never kept
    if (adaptive_) {
      const size_t kept = adaptive_->keep(d.size(), drafts_[i].confidence);
      counters_.spec_num_unverified_draft_tokens += d.size() - kept;
      d.resize(kept);
    }
    if (!rows.empty()) rows.resize(d.size());
    drafting_[i]->draft_tokens = std::move(d);
    drafting_[i]->draft_rows = std::move(rows);
  }
  drafting_.clear();
}

bool EngineLoop::step() {
  SchedulerOutput sched = scheduler_.schedule();
  // The host tier's copies of this schedule (also one that admitted nobody: a prefix match that
  // restored blocks and then found no room has registered them, and they must be filled).
  const KvManager::Transfers transfers = kv_.take_transfers();
  if (!transfers.empty()) {
    try {
      runner_.copy_kv_blocks(transfers);
    } catch (const std::exception& e) {
      // The restored blocks are registered with contents that never arrived: nothing may read them.
      M3_LOG_ERROR("KV block copies failed ({} to host, {} back): {}", transfers.to_host.size(),
                   transfers.to_device.size(), e.what());
      fail_step(sched.scheduled, e.what());
      kv_.drop_failed(transfers);
      return true;
    }
  }
  if (sched.empty()) return false;
  const Clock::time_point started = Clock::now();
  const uint64_t generated_before = counters_.generation_tokens_total;
  int64_t decode_tokens = 0;  // requests' last tokens and drafts; the rest are prompt chunks
  for (const ScheduledSeq& s : sched.scheduled)
    if (s.seq->num_computed_tokens == s.seq->num_tokens() - 1) decode_tokens += s.num_new_tokens;
  ++counters_.num_steps;
  const auto bucket = std::lower_bound(kIterationTokenBuckets.begin(), kIterationTokenBuckets.end(), sched.num_tokens);
  ++counters_.iteration_tokens_counts[static_cast<std::size_t>(bucket - kIterationTokenBuckets.begin())];
  counters_.iteration_tokens_sum += static_cast<uint64_t>(sched.num_tokens);
  const Clock::time_point now = Clock::now();
  for (const ScheduledSeq& s : sched.scheduled) {
    if (!s.seq->first_scheduled_time) s.seq->first_scheduled_time = now;
  }
  build_step(sched.scheduled, kv_.block_size(), plan_);
  outputs_.resize(sched.scheduled.size());
  sampling_.clear();
  host_rows_.clear();
  mask_requests_.clear();
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i) plan_outputs(i, *sched.scheduled[i].seq);
  sampled_.assign(sampling_.rows.size(), -1);
  logprobs_.assign(sampling_.logprobs.size(), RowLogprobs{});
  logits_.resize(host_rows_.size() * static_cast<std::size_t>(vocab_size_));
  start_masks();
  try {
    runner_.forward_sample(plan_.batch, sampling_, sampled_.data(), logprobs_.data(), host_rows_, logits_.data());
  } catch (const std::exception& e) {
    mask_worker_.wait();  // the constraints are the sequences'; nothing may still be filling
    M3_LOG_ERROR("engine step failed for {} request(s): {}", sched.scheduled.size(), e.what());
    fail_step(sched.scheduled, e.what());
    return true;
  }
  mask_worker_.wait();  // a runner that sampled nothing never waited
  sampling_.masks_ready = nullptr;

  drafting_.clear();
  for (std::size_t i = 0; i < sched.scheduled.size(); ++i) {
    Sequence& seq = *sched.scheduled[i].seq;
    const SeqLogitsRows& rows = plan_.rows[i];
    const SeqOutputs& outs = outputs_[i];
    seq.num_computed_tokens += sched.scheduled[i].num_new_tokens - rows.num_drafts;  // drafts: once verified
    kv_.commit_computed(seq);
    if (rows.num_prompt_rows > 0) collect_prompt_logprobs(seq, rows, outs.first_prompt_logprob_row);
    if (rows.sample_row < 0) continue;
    RequestOutput out;
    if (rows.num_drafts > 0) {
      out = advance_speculative(seq, rows, outs);
    } else {
      const int32_t sampled = outs.sample_index >= 0 ? sampled_[outs.sample_index] : -1;
      const std::string* mask_error = outs.mask_job >= 0 ? &mask_jobs_[outs.mask_job].error : nullptr;
      out = advance(seq, sampled, outs.sample_logprob_row, mask_error);
    }
    seq.draft_tokens.clear();
    seq.draft_rows.clear();
    const bool finished = out.finished;
    if (emit(seq, out) && !finished && max_drafts(seq) > 0) drafting_.push_back(&seq);
  }
  propose_drafts();
  counters_.num_preemptions = scheduler_.num_preemptions();
  if (adaptive_) {
    adaptive_->observe(decode_tokens, sched.num_tokens - decode_tokens,
                       static_cast<int64_t>(counters_.generation_tokens_total - generated_before),
                       std::chrono::duration<double>(Clock::now() - started).count());
    counters_.spec_verify_threshold = adaptive_->threshold();
  }
  return true;
}

EngineStats EngineLoop::stats() const {
  EngineStats s = counters_;
  s.num_running = static_cast<int>(scheduler_.running().size());
  s.num_waiting = static_cast<int>(scheduler_.waiting().size());
  s.num_kv_blocks = kv_.pool().num_blocks();
  s.num_used_kv_blocks = kv_.pool().num_used();
  s.kv_usage = s.num_kv_blocks ? double(s.num_used_kv_blocks) / double(s.num_kv_blocks) : 0.0;
  s.prefix_cache_queries_tokens = scheduler_.prefix_cache_queries_tokens();
  s.prefix_cache_hits_tokens = scheduler_.prefix_cache_hits_tokens();
  s.num_preemptions = scheduler_.num_preemptions();
  if (const HostKvTier* host = kv_.host_tier()) {
    s.external_prefix_cache_queries_tokens = scheduler_.external_prefix_cache_queries_tokens();
    s.external_prefix_cache_hits_tokens = scheduler_.external_prefix_cache_hits_tokens();
    s.num_host_kv_blocks = host->num_slots();
    s.num_stored_host_kv_blocks = host->num_stored();
    const int64_t block_bytes = runner_.kv_block_bytes();
    s.kv_offload_blocks_to_host = kv_.blocks_to_host();
    s.kv_offload_blocks_to_device = kv_.blocks_to_device();
    s.kv_offload_bytes_to_host = kv_.blocks_to_host() * block_bytes;
    s.kv_offload_bytes_to_device = kv_.blocks_to_device() * block_bytes;
    const KvCopyTimes times = runner_.kv_copy_times();
    s.kv_offload_seconds_to_host = times.to_host_s;
    s.kv_offload_seconds_to_device = times.to_device_s;
    s.kv_offload_blocks_saved_ahead = kv_.blocks_saved_ahead();
    s.kv_offload_steps_waiting = kv_.steps_waiting_for_saves();
  }
  return s;
}

}  // namespace m3
