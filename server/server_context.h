// The state the routes share: options fixed at start, metrics, readiness and the loaded model.
// The HTTP server listens before the model is loaded, so /health can say "not ready" (503) while
// weights load; model routes answer 503 until set_model() and again once draining starts.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"
#include "server/background_tasks.h"
#include "server/constraint_compiler.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/response_store.h"
#include "server/sampling_params.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace m3::server {

struct ServeOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  std::vector<std::string> api_keys;            // empty: no authentication
  std::vector<std::string> served_model_names;  // the first one is reported in responses
  std::string model_path;                       // reported as the model's "root"
  std::string version;                          // reported by /version
  HttpLimits http;
  RequestLimits request_limits;
  std::string reasoning_parser;  // empty: reasoning stays in the content
  std::string tool_call_parser;  // empty: no tool-call parsing
  bool enable_auto_tool_choice = false;
  bool enable_prompt_tokens_details = false;  // usage.prompt_tokens_details.cached_tokens (vLLM's flag)
  ResponseStoreLimits response_store;  // /v1/responses kept for previous_response_id
};

// The loaded model as the routes see it. Immutable once published.
struct ModelContext {
  text::Tokenizer tokenizer;
  std::optional<text::ChatTemplate> chat_template;  // none: chat requests get a 400
  EngineCore* engine = nullptr;                     // owned by the serve command
  GenerationDefaults defaults;
  std::vector<int32_t> eos_token_ids;
  int max_model_len = 0;
  int vocab_size = 0;
  std::optional<CacheConfigInfo> cache_config;  // for vllm:cache_config_info
  // Structured outputs: compiled grammars over this model's vocabulary (built on first use).
  std::shared_ptr<ConstraintCompiler> constraints = std::make_shared<ConstraintCompiler>();
};

class ServerContext {
 public:
  explicit ServerContext(ServeOptions options);

  const ServeOptions& options() const { return options_; }
  const std::string& model_name() const { return options_.served_model_names.front(); }
  bool is_served_model(const std::string& name) const;
  ServerMetrics& metrics() { return metrics_; }
  ResponseStore& responses() { return responses_; }
  int64_t start_time() const { return start_time_; }

  void set_model(std::shared_ptr<const ModelContext> model);
  // The model, or null while loading.
  std::shared_ptr<const ModelContext> model() const;
  // The model for a request: ApiError 503 while loading or draining.
  std::shared_ptr<const ModelContext> require_model() const;

  void begin_draining() { draining_ = true; }
  bool draining() const { return draining_; }
  bool ready() const { return model() && !draining_; }

  // Background responses (the Responses API's background: true): the thread they run on, and
  // how to cancel each one still running, by response id (the function only posts the cancel).
  BackgroundTasks& background_tasks() { return background_tasks_; }
  // False (nothing added) when as many background responses as the response store holds are
  // running already: each must be stored, and a client must not queue unbounded work this way.
  bool add_background(const std::string& id, std::function<void()> cancel);
  void remove_background(const std::string& id);
  // The running response's cancel, or an empty function when it is not running (any more).
  std::function<void()> background_cancel(const std::string& id) const;

  // Requests that are generating (for draining).
  int in_flight() const { return in_flight_; }
  class InFlight {
   public:
    explicit InFlight(ServerContext& context) : context_(context) { ++context_.in_flight_; }
    ~InFlight() { --context_.in_flight_; }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    ServerContext& context_;
  };

 private:
  ServeOptions options_;
  ServerMetrics metrics_;
  ResponseStore responses_;
  int64_t start_time_;
  mutable std::mutex model_mutex_;
  std::shared_ptr<const ModelContext> model_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  mutable std::mutex background_mutex_;
  std::unordered_map<std::string, std::function<void()>> background_;
  // Last: its thread stops (and drops what it had queued) before the members above go.
  BackgroundTasks background_tasks_;
};

}  // namespace m3::server
