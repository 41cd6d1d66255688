#include "engine/engine_core.h"

#include <climits>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine_loop.h"

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

}  // namespace

struct EngineCore::State {
  std::unique_ptr<ModelRunner> runner;
  EngineConfig config;
  EngineLoop loop;

  std::mutex mu;  // guards everything below up to `thread`
  std::condition_variable cv;
  std::vector<Command> inbox;
  std::unordered_set<std::string> live_ids;  // accepted and not yet finished
  Mode mode = Mode::kOpen;
  bool started = false;
  std::thread thread;  // set once under mu (start_locked), joined under join_mu
  std::mutex join_mu;

  mutable std::mutex stats_mu;
  EngineStats stats;

  State(std::unique_ptr<ModelRunner> r, const EngineConfig& c)
      : runner(std::move(r)), config(resolve_config(c, *runner)), loop(*runner, config) {
    stats = loop.stats();
  }

  void start_locked() {
    if (started) return;
    started = true;
    thread = std::thread([this] { run(); });
  }

  void publish_stats() {
    EngineStats s = loop.stats();
    std::lock_guard lock(stats_mu);
    stats = s;
  }

  void apply(Command& c) {
    if (c.kind == Command::Kind::kAbort) {
      loop.abort(c.request.id);
      return;
    }
    OutputSink sink = c.sink;  // kept to report a failure after the moves below
    const std::string id = c.request.id;
    try {
      loop.add(std::move(c.request), std::move(c.sink), c.seed, c.arrival);
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

  void run() {
    std::vector<Command> commands;
    for (;;) {
      Mode current;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return !inbox.empty() || mode != Mode::kOpen || loop.has_work(); });
        commands.swap(inbox);
        current = mode;
      }
      for (Command& c : commands) apply(c);
      commands.clear();
      if (current == Mode::kStopping) {
        loop.abort_all();
        publish_stats();
        return;
      }
      if (loop.has_work()) {
        loop.step();
      } else if (current == Mode::kDraining) {
        std::lock_guard lock(mu);
        if (inbox.empty()) {
          publish_stats();
          return;
        }
      }
      publish_stats();
    }
  }
};

EngineCore::EngineCore(std::unique_ptr<ModelRunner> runner, EngineConfig config) {
  M3_CHECK(runner != nullptr, "EngineCore needs a model runner");
  state_ = std::make_unique<State>(std::move(runner), config);
  M3_LOG_INFO("engine: {} KV blocks x {} tokens = {} tokens, max_model_len {}, max_num_seqs {}, "
              "max_num_batched_tokens {}, prefix caching {}",
              state_->runner->num_kv_blocks(), block_size(), kv_capacity_tokens(), max_model_len(),
              state_->config.max_num_seqs, state_->config.max_num_batched_tokens,
              state_->config.enable_prefix_caching ? "on" : "off");
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
    // first so that its thread aborts them rather than starting to run them.
    state_->start_locked();
  }
  state_->cv.notify_all();
  std::lock_guard join_lock(state_->join_mu);  // shutdown may race with the destructor's
  if (state_->thread.joinable()) state_->thread.join();
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
  for (int32_t id : request.sampling.forced_tokens) {
    M3_CHECK(id < vocab, "request {}: forced token {} is outside the vocabulary (size {})", request.id, id, vocab);
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  M3_CHECK(prompt_len <= max_len,
           "request {}: the prompt has {} tokens, more than the maximum model length of {} tokens", request.id,
           prompt_len, max_len);
  M3_CHECK(prompt_len + request.sampling.max_tokens <= max_len,
           "request {}: this model's maximum context length is {} tokens. However, you requested {} tokens ({} "
           "in the prompt, {} for the completion). Please reduce the prompt or max_tokens.",
           request.id, max_len, prompt_len + request.sampling.max_tokens, prompt_len, request.sampling.max_tokens);

  Command c{Command::Kind::kAdd, std::move(request), nullptr, 0, Clock::now()};
  if (c.request.sampling.seed) {
    c.seed = *c.request.sampling.seed;
  } else {
    std::random_device device;
    c.seed = (uint64_t(device()) << 32) | device();
  }
  {
    std::lock_guard lock(state_->mu);
    M3_CHECK(state_->mode == Mode::kOpen, "request {}: the engine is shutting down", c.request.id);
    M3_CHECK(state_->live_ids.insert(c.request.id).second, "request {}: a request with this id is already in flight",
             c.request.id);
    State* s = state_.get();
    // The id leaves the in-flight set before the final output is delivered (so the sink may reuse
    // it), or when the sink throws (the engine then drops the request).
    c.sink = [s, id = c.request.id, user_sink = std::move(sink)](const RequestOutput& out) {
      auto forget = [&] {
        std::lock_guard lock(s->mu);
        s->live_ids.erase(id);
      };
      if (out.finished) forget();
      try {
        if (user_sink) user_sink(out);
      } catch (...) {
        if (!out.finished) forget();
        throw;
      }
    };
    state_->inbox.push_back(std::move(c));
  }
  state_->cv.notify_all();
}

void EngineCore::abort(const std::string& request_id) {
  {
    std::lock_guard lock(state_->mu);
    Command c{Command::Kind::kAbort, {}, nullptr, 0, {}};
    c.request.id = request_id;
    state_->inbox.push_back(std::move(c));
  }
  state_->cv.notify_all();
}

EngineStats EngineCore::stats() const {
  std::lock_guard lock(state_->stats_mu);
  return state_->stats;
}

int EngineCore::max_model_len() const { return state_->config.max_model_len; }
int64_t EngineCore::kv_capacity_tokens() const { return state_->runner->num_kv_blocks() * state_->runner->block_size(); }
int EngineCore::block_size() const { return state_->runner->block_size(); }
int EngineCore::vocab_size() const { return state_->runner->vocab_size(); }

}  // namespace m3
