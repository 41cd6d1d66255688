#include "engine/engine_core.h"

#include <climits>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/core.h>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine_loop.h"
#include "engine/lane_router.h"
#include "engine/step_group.h"

namespace m3 {
namespace {

// Resolves max_model_len against the model and the KV pool (vLLM's wording where it has one).
EngineConfig resolve_config(EngineConfig config, const ModelRunner& runner) {
  M3_CHECK(config.max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", config.max_num_seqs);
  M3_CHECK(config.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
           config.max_num_batched_tokens);
  // Otherwise a full batch of decodes would not fit one step and the newest would starve.
  M3_CHECK(config.max_num_batched_tokens >= config.max_num_seqs,
           "max_num_batched_tokens ({}) must be greater than or equal to max_num_seqs ({})",
           config.max_num_batched_tokens, config.max_num_seqs);
  M3_CHECK(config.max_model_len >= 0, "max_model_len must be >= 0 (0 = automatic), got {}", config.max_model_len);
  const int64_t capacity = runner.num_kv_blocks() * runner.block_size();
  int64_t model_max = runner.max_position_embeddings();
  if (model_max <= 0) model_max = INT_MAX;
  if (config.max_model_len == 0) {
    config.max_model_len = static_cast<int>(std::min<int64_t>({model_max, capacity, INT_MAX}));
  } else {
    M3_CHECK(config.max_model_len <= model_max,
             "max_model_len {} is larger than the model's max_position_embeddings {}", config.max_model_len,
             model_max);
    M3_CHECK(config.max_model_len <= capacity,
             "max_model_len {} does not fit the KV cache: {} blocks of {} tokens hold {} tokens; lower "
             "max_model_len or give the KV cache more memory",
             config.max_model_len, runner.num_kv_blocks(), runner.block_size(), capacity);
  }
  // vLLM's rule and wording: without chunked prefill the longest prompt must fit one step.
  M3_CHECK(config.enable_chunked_prefill || config.max_num_batched_tokens >= config.max_model_len,
           "max_num_batched_tokens ({}) is smaller than max_model_len ({}) with chunked prefill disabled. This "
           "effectively limits the maximum sequence length to max_num_batched_tokens and makes the engine reject "
           "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
           config.max_num_batched_tokens, config.max_model_len);
  return config;
}

struct Command {
  enum class Kind { kAdd, kAbort } kind;
  EngineRequest request;  // kAdd; kAbort uses request.id
  OutputSink sink;
  uint64_t seed = 0;
  Clock::time_point arrival{};
};

enum class Mode { kOpen, kDraining, kStopping };

// A lane's runner as its loop sees it: with several lanes every model call first enters the
// lanes' common step.
class LaneRunner final : public ModelRunner {
 public:
  LaneRunner(ModelRunner& inner, StepGroup* group, int lane) : inner_(inner), group_(group), lane_(lane) {}
  int block_size() const override { return inner_.block_size(); }
  int64_t num_kv_blocks() const override { return inner_.num_kv_blocks(); }
  int vocab_size() const override { return inner_.vocab_size(); }
  int64_t max_position_embeddings() const override { return inner_.max_position_embeddings(); }
  void forward(const StepBatch& batch, float* logits) override {
    enter();
    inner_.forward(batch, logits);
  }
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) override {
    enter();
    inner_.forward_sample(batch, sampling, sampled_ids, logprobs, host_rows, host_logits);
  }
  void idle_step() override {
    enter();
    inner_.idle_step();
  }
  // Not a step of the lanes' group: a lane's copies touch only its own pool and host tier.
  int64_t num_host_kv_blocks() const override { return inner_.num_host_kv_blocks(); }
  int64_t kv_block_bytes() const override { return inner_.kv_block_bytes(); }
  void copy_kv_blocks(const KvBlockCopies& copies) override { inner_.copy_kv_blocks(copies); }
  KvCopyTimes kv_copy_times() const override { return inner_.kv_copy_times(); }
  Drafter* drafter() override { return inner_.drafter(); }

 private:
  void enter() {
    if (group_) group_->enter(lane_);
  }
  ModelRunner& inner_;
  StepGroup* group_;
  int lane_;
};

struct Lane {
  std::unique_ptr<ModelRunner> model;
  LaneRunner runner;
  EngineLoop loop;
  std::vector<Command> inbox;  // guarded by State::mu
  int live = 0;                // requests in flight here (State::mu)
  bool busy = false;           // had work at its last look (State::mu)
  std::thread thread;

  Lane(std::unique_ptr<ModelRunner> m, StepGroup* group, int index, const EngineConfig& config)
      : model(std::move(m)), runner(*model, group, index), loop(runner, config) {}
};

}  // namespace

struct EngineCore::State {
  EngineConfig config;
  std::unique_ptr<StepGroup> group;  // several lanes only
  std::vector<std::unique_ptr<Lane>> lanes;
  std::function<void(int)> on_lane_start;

  std::mutex mu;  // guards the lanes' inboxes, live counts and busy flags, and everything below
  std::condition_variable cv;
  std::unordered_map<std::string, int> live_ids;  // accepted and not yet finished -> lane
  Mode mode = Mode::kOpen;
  bool started = false;
  std::mutex join_mu;  // joins of the lanes' threads (set once under mu in start_locked)

  std::mt19937_64 unseeded_draws;  // seeds of requests without one (mu), from EngineConfig::seed
  // Several lanes with prefix caching: which lane takes a request (its table under mu).
  std::unique_ptr<LaneRouter> router;
  std::vector<int> live_counts;  // scratch of add_request (mu)

  mutable std::mutex stats_mu;
  std::vector<EngineStats> stats;  // per lane

  State(std::vector<std::unique_ptr<ModelRunner>> runners, const EngineConfig& c, std::function<void(int)> start)
      : on_lane_start(std::move(start)) {
    M3_CHECK(!runners.empty(), "EngineCore needs a model runner");
    for (const auto& r : runners) M3_CHECK(r != nullptr, "EngineCore needs a model runner");
    config = resolve_config(c, *runners.front());
    unseeded_draws.seed(config.seed);
    for (const auto& r : runners)
      M3_CHECK(r->num_kv_blocks() == runners.front()->num_kv_blocks() && r->block_size() == runners.front()->block_size() &&
                   r->vocab_size() == runners.front()->vocab_size(),
               "data-parallel lanes must have the same KV pool and vocabulary");
    if (runners.size() > 1) {
      group = std::make_unique<StepGroup>(static_cast<int>(runners.size()), [this] {
        // Taking mu orders the wake after a lane's check of waiting_for() under mu.
        { std::lock_guard lock(mu); }
        cv.notify_all();
      });
    }
    for (size_t i = 0; i < runners.size(); ++i)
      lanes.push_back(std::make_unique<Lane>(std::move(runners[i]), group.get(), static_cast<int>(i), config));
    for (const auto& l : lanes) stats.push_back(l->loop.stats());
    if (lanes.size() > 1 && config.enable_prefix_caching) {
      const ModelRunner& m = *lanes.front()->model;
      // Every lane's pool and host tier, in blocks: the prefixes the lanes can hold together.
      const int64_t blocks = (m.num_kv_blocks() + m.num_host_kv_blocks()) * static_cast<int64_t>(lanes.size());
      router = std::make_unique<LaneRouter>(static_cast<int>(lanes.size()), m.block_size(), blocks);
    }
  }

  void start_locked() {
    if (started) return;
    started = true;
    for (size_t i = 0; i < lanes.size(); ++i) lanes[i]->thread = std::thread([this, i] { run(static_cast<int>(i)); });
  }

  void publish_stats(int lane) {
    EngineStats s = lanes[lane]->loop.stats();
    std::lock_guard lock(stats_mu);
    stats[lane] = s;
  }

  void apply(Lane& lane, Command& c) {
    if (c.kind == Command::Kind::kAbort) {
      lane.loop.abort(c.request.id);
      return;
    }
    OutputSink sink = c.sink;  // kept to report a failure after the moves below
    const std::string id = c.request.id;
    try {
      lane.loop.add(std::move(c.request), std::move(c.sink), c.seed, c.arrival);
    } catch (const std::exception& e) {  // validated already: only resource exhaustion gets here
      M3_LOG_ERROR("engine: could not queue a request: {}", e.what());
      RequestOutput out;
      out.request_id = id;
      out.finished = true;
      out.finish_reason = FinishReason::kError;
      out.error = e.what();
      try {
        sink(out);
      } catch (...) {
      }
    }
  }

  // A lane's busy flag is what draining peers wait on: they leave once every lane is idle.
  void set_busy(Lane& lane, bool busy) {
    bool became_idle;
    {
      std::lock_guard lock(mu);
      became_idle = lane.busy && !busy;
      lane.busy = busy;
    }
    if (became_idle) cv.notify_all();
  }

  bool any_lane_busy() const {
    for (const auto& l : lanes)
      if (l->busy || !l->inbox.empty()) return true;
    return false;
  }

  void run(int index) {
    Lane& lane = *lanes[index];
    if (on_lane_start) {
      try {
        on_lane_start(index);
      } catch (const std::exception& e) {
        M3_LOG_ERROR("engine lane {}: {}", index, e.what());
      }
    }
    std::vector<Command> commands;
    for (;;) {
      Mode current;
      bool join_peers = false;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] {
          return !lane.inbox.empty() || mode == Mode::kStopping || lane.loop.has_work() ||
                 (group && group->waiting_for(index)) || (mode == Mode::kDraining && !any_lane_busy());
        });
        commands.swap(lane.inbox);
        current = mode;
        join_peers = group && group->waiting_for(index);
      }
      for (Command& c : commands) apply(lane, c);
      commands.clear();
      if (current == Mode::kStopping) {
        if (group) group->close();  // peers waiting in a step stop too
        lane.loop.abort_all();
        publish_stats(index);
        return;
      }
      const bool work = lane.loop.has_work();
      set_busy(lane, work);
      const bool ran = work && lane.loop.step();
      if (ran) set_busy(lane, lane.loop.has_work());
      if (!ran && join_peers) {
        try {
          lane.runner.idle_step();
        } catch (const std::exception& e) {
          M3_LOG_ERROR("engine lane {}: idle step failed: {}", index, e.what());
        }
      } else if (!ran && current == Mode::kDraining) {
        std::lock_guard lock(mu);
        // A draining lane leaves once no lane has work left (its peers' steps need it until then).
        if (lane.inbox.empty() && !any_lane_busy()) {
          cv.notify_all();
          publish_stats(index);
          return;
        }
      }
      publish_stats(index);
    }
  }
};

namespace {
std::vector<std::unique_ptr<ModelRunner>> one_lane(std::unique_ptr<ModelRunner> runner) {
  std::vector<std::unique_ptr<ModelRunner>> lanes;
  lanes.push_back(std::move(runner));
  return lanes;
}
}  // namespace

EngineCore::EngineCore(std::unique_ptr<ModelRunner> runner, EngineConfig config)
    : EngineCore(one_lane(std::move(runner)), config) {}

EngineCore::EngineCore(std::vector<std::unique_ptr<ModelRunner>> lanes, EngineConfig config,
                       std::function<void(int)> on_lane_start) {
  state_ = std::make_unique<State>(std::move(lanes), config, std::move(on_lane_start));
  const ModelRunner& first = *state_->lanes.front()->model;
  M3_LOG_INFO("engine: {}{} KV blocks x {} tokens = {} tokens, max_model_len {}, max_num_seqs {}, "
              "max_num_batched_tokens {}, prefix caching {}",
              num_lanes() > 1 ? fmt::format("{} data-parallel lanes of ", num_lanes()) : "", first.num_kv_blocks(),
              block_size(), first.num_kv_blocks() * first.block_size(), max_model_len(), state_->config.max_num_seqs,
              state_->config.max_num_batched_tokens, state_->config.enable_prefix_caching ? "on" : "off");
}

EngineCore::~EngineCore() { shutdown(false); }

void EngineCore::start() {
  std::lock_guard lock(state_->mu);
  state_->start_locked();
}

void EngineCore::shutdown(bool drain) {
  {
    std::lock_guard lock(state_->mu);
    if (!drain || state_->mode == Mode::kOpen) {
      state_->mode = drain ? Mode::kDraining : Mode::kStopping;
    }
    // A never-started engine still owes its queued requests a final output; the mode is set
    // first so that its threads abort them rather than starting to run them.
    state_->start_locked();
  }
  state_->cv.notify_all();
  std::lock_guard join_lock(state_->join_mu);  // shutdown may race with the destructor's
  for (auto& lane : state_->lanes)
    if (lane->thread.joinable()) lane->thread.join();
}

void EngineCore::add_request(EngineRequest request, OutputSink sink) {
  request.sampling.validate();
  const int vocab = vocab_size();
  const int max_len = max_model_len();
  M3_CHECK(!request.id.empty(), "request id must not be empty");
  M3_CHECK(!request.prompt_token_ids.empty(), "request {}: the prompt must contain at least one token", request.id);
  for (std::size_t i = 0; i < request.prompt_token_ids.size(); ++i) {
    const int32_t id = request.prompt_token_ids[i];
    M3_CHECK(id >= 0 && id < vocab, "request {}: prompt token {} at index {} is outside the vocabulary (size {})",
             request.id, id, i, vocab);
  }
  for (int32_t id : request.sampling.logit_bias_ids) {
    M3_CHECK(id < vocab, "request {}: logit_bias token {} is outside the vocabulary (size {})", request.id, id, vocab);
  }
  for (const auto* forced : {&request.sampling.forced_tokens, &request.sampling.reasoning_end}) {
    for (int32_t id : *forced) {
      M3_CHECK(id < vocab, "request {}: forced token {} is outside the vocabulary (size {})", request.id, id, vocab);
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  M3_CHECK(prompt_len <= max_len,
           "request {}: the prompt has {} tokens, more than the maximum model length of {} tokens", request.id,
           prompt_len, max_len);
  M3_CHECK(prompt_len + request.sampling.max_tokens <= max_len,
           "request {}: this model's maximum context length is {} tokens. However, you requested {} tokens ({} "
           "in the prompt, {} for the completion). Please reduce the prompt or max_tokens.",
           request.id, max_len, prompt_len + request.sampling.max_tokens, prompt_len, request.sampling.max_tokens);

  // Hashed before the lock (a long prompt's chain takes a while); the router is set at
  // construction, so reading the pointer needs no lock.
  const std::vector<uint64_t> hashes =
      state_->router ? state_->router->block_hashes(request.prompt_token_ids) : std::vector<uint64_t>();
  Command c{Command::Kind::kAdd, std::move(request), nullptr, 0, Clock::now()};
  {
    std::lock_guard lock(state_->mu);
    M3_CHECK(state_->mode == Mode::kOpen, "request {}: the engine is shutting down", c.request.id);
    State* s = state_.get();
    M3_CHECK(!s->live_ids.contains(c.request.id), "request {}: a request with this id is already in flight",
             c.request.id);
    // Drawn only for accepted requests, so the sequence of draws is the sequence of requests.
    c.seed = c.request.sampling.seed ? *c.request.sampling.seed : s->unseeded_draws();
    int lane = 0;
    if (s->lanes.size() > 1) {
      s->live_counts.resize(s->lanes.size());
      for (size_t i = 0; i < s->lanes.size(); ++i) s->live_counts[i] = s->lanes[i]->live;
      if (s->router) {
        lane = s->router->choose(std::span<const uint64_t>(hashes), s->live_counts);
      } else {  // no prefix cache to find: the fewest in flight
        for (int i = 1; i < static_cast<int>(s->lanes.size()); ++i)
          if (s->live_counts[i] < s->live_counts[lane]) lane = i;
      }
    }
    s->live_ids.emplace(c.request.id, lane);
    ++s->lanes[lane]->live;
    // The id leaves the in-flight set before the final output is delivered (so the sink may reuse
    // it), or when the sink throws (the engine then drops the request).
    c.sink = [s, id = c.request.id, user_sink = std::move(sink)](const RequestOutput& out) {
      auto forget = [&] {
        std::lock_guard lock(s->mu);
        auto it = s->live_ids.find(id);
        if (it == s->live_ids.end()) return;
        --s->lanes[it->second]->live;
        s->live_ids.erase(it);
      };
      if (out.finished) forget();
      try {
        if (user_sink) user_sink(out);
      } catch (...) {
        if (!out.finished) forget();
        throw;
      }
    };
    s->lanes[lane]->inbox.push_back(std::move(c));
  }
  state_->cv.notify_all();
}

void EngineCore::abort(const std::string& request_id) {
  {
    std::lock_guard lock(state_->mu);
    // To the request's lane; an unknown id goes nowhere (a lane would ignore it anyway).
    auto it = state_->live_ids.find(request_id);
    if (it == state_->live_ids.end()) return;
    Command c{Command::Kind::kAbort, {}, nullptr, 0, {}};
    c.request.id = request_id;
    state_->lanes[it->second]->inbox.push_back(std::move(c));
  }
  state_->cv.notify_all();
}

EngineStats EngineCore::stats() const {
  std::lock_guard lock(state_->stats_mu);
  EngineStats sum;
  for (const EngineStats& s : state_->stats) {
    sum.num_running += s.num_running;
    sum.num_waiting += s.num_waiting;
    sum.num_kv_blocks += s.num_kv_blocks;
    sum.num_used_kv_blocks += s.num_used_kv_blocks;
    sum.prompt_tokens_total += s.prompt_tokens_total;
    sum.generation_tokens_total += s.generation_tokens_total;
    sum.prefix_cache_queries_tokens += s.prefix_cache_queries_tokens;
    sum.prefix_cache_hits_tokens += s.prefix_cache_hits_tokens;
    sum.num_preemptions += s.num_preemptions;
    sum.external_prefix_cache_queries_tokens += s.external_prefix_cache_queries_tokens;
    sum.external_prefix_cache_hits_tokens += s.external_prefix_cache_hits_tokens;
    sum.num_host_kv_blocks += s.num_host_kv_blocks;
    sum.num_stored_host_kv_blocks += s.num_stored_host_kv_blocks;
    sum.kv_offload_blocks_to_host += s.kv_offload_blocks_to_host;
    sum.kv_offload_blocks_to_device += s.kv_offload_blocks_to_device;
    sum.kv_offload_bytes_to_host += s.kv_offload_bytes_to_host;
    sum.kv_offload_bytes_to_device += s.kv_offload_bytes_to_device;
    sum.kv_offload_seconds_to_host += s.kv_offload_seconds_to_host;
    sum.kv_offload_seconds_to_device += s.kv_offload_seconds_to_device;
    sum.kv_offload_blocks_saved_ahead += s.kv_offload_blocks_saved_ahead;
    sum.kv_offload_steps_waiting += s.kv_offload_steps_waiting;
    sum.finished_stop += s.finished_stop;
    sum.finished_length += s.finished_length;
    sum.finished_abort += s.finished_abort;
    sum.finished_error += s.finished_error;
    sum.num_steps = std::max(sum.num_steps, s.num_steps);  // the lanes step together
    for (std::size_t b = 0; b < s.iteration_tokens_counts.size(); ++b)
      sum.iteration_tokens_counts[b] += s.iteration_tokens_counts[b];
    sum.iteration_tokens_sum += s.iteration_tokens_sum;
    sum.spec_num_drafts += s.spec_num_drafts;
    sum.spec_num_draft_tokens += s.spec_num_draft_tokens;
    sum.spec_num_accepted_tokens += s.spec_num_accepted_tokens;
    sum.spec_adaptive_verification = sum.spec_adaptive_verification || s.spec_adaptive_verification;
    sum.spec_num_unverified_draft_tokens += s.spec_num_unverified_draft_tokens;
    sum.spec_verify_threshold = std::max(sum.spec_verify_threshold, s.spec_verify_threshold);
    if (sum.spec_accepted_per_pos.size() < s.spec_accepted_per_pos.size())
      sum.spec_accepted_per_pos.resize(s.spec_accepted_per_pos.size());
    for (std::size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i)
      sum.spec_accepted_per_pos[i] += s.spec_accepted_per_pos[i];
  }
  sum.kv_usage = sum.num_kv_blocks ? double(sum.num_used_kv_blocks) / double(sum.num_kv_blocks) : 0.0;
  return sum;
}

int EngineCore::max_model_len() const { return state_->config.max_model_len; }
int64_t EngineCore::kv_capacity_tokens() const {
  const ModelRunner& r = *state_->lanes.front()->model;
  return r.num_kv_blocks() * r.block_size() * num_lanes();
}
int EngineCore::block_size() const { return state_->lanes.front()->model->block_size(); }
int EngineCore::vocab_size() const { return state_->lanes.front()->model->vocab_size(); }
int EngineCore::num_lanes() const { return static_cast<int>(state_->lanes.size()); }

}  // namespace m3
