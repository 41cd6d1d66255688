// `m3serve serve MODEL [options]`: the OpenAI-compatible server, a drop-in for `vllm serve`.
// Accepts vLLM's option names (including the seed command lines of docs/reference.md D7);
// options it cannot honour on this machine fail at start with a message naming them.
//
// Start-up: bind the port first (so /health answers 503 while loading), load the model with a
// progress bar, print the KV capacity, then serve. SIGINT/SIGTERM drain: new requests get 503,
// requests in flight finish (up to --shutdown-timeout, then they are aborted), and the process
// exits 0. A second signal aborts at once.
#include <algorithm>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "app/serve_options.h"
#include "app/vllm_compat_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "server/openai_server.h"
#include "server/sampling_params.h"
#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::app {
namespace {

struct ServeArgs {
  std::string model_positional;
  ModelOptions model;
  EngineOptions engine;
  server::ServeOptions serve;
  std::vector<std::string> api_keys;
  std::string chat_template;
  std::string tokenizer;  // --tokenizer: a folder with the tokenizer files (or a repo id), instead of the model's
  std::optional<std::string> tokenizer_revision;  // --tokenizer-revision: of a --tokenizer repo id
  std::string generation_config = "auto";
  std::string log_level = "info";
  std::string max_body_size = "32MiB";
  std::string max_header_size = "64KiB";
  int shutdown_timeout_s = 30;
  bool disable_log_stats = false;
  GivenCompatFlags compat;  // vLLM options without a counterpart (app/vllm_compat_flags.h)
};

// Blocks SIGINT/SIGTERM in every thread (call before starting any) and waits for them on one.
class SignalWatcher {
 public:
  SignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0) continue;
        {
          std::lock_guard lock(mutex_);
          if (stopped_) return;
          ++count_;
          last_ = sig;
        }
        if (exit_now_) {
          // Nothing is being served yet (the model is loading): stop right away.
          M3_LOG_WARN("{} while loading the model: exiting", sig == SIGINT ? "SIGINT" : "SIGTERM");
          std::_Exit(128 + sig);
        }
        changed_.notify_all();
      }
    });
  }
  ~SignalWatcher() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes sigwait, which sees stopped_
    thread_.join();
  }
  // Until this is called, a signal ends the process at once.
  void start_draining_on_signal() { exit_now_ = false; }
  // Waits until at least `n` signals arrived or `timeout` passed; returns the count.
  int wait_for(int n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, timeout, [&] { return count_ >= n; });
    return count_;
  }
  const char* last_name() {
    std::lock_guard lock(mutex_);
    return last_ == SIGINT ? "SIGINT" : "SIGTERM";
  }

 private:
  sigset_t set_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
  int last_ = 0;
  bool stopped_ = false;
  std::atomic<bool> exit_now_{true};
  std::thread thread_;
};

// vLLM-style periodic throughput log (every 10 s while there is activity).
void log_stats(const EngineStats& now, const EngineStats& before, double seconds) {
  if (now.prompt_tokens_total == before.prompt_tokens_total &&
      now.generation_tokens_total == before.generation_tokens_total && now.num_running == 0 &&
      now.num_waiting == 0) {
    return;
  }
  const double queries = static_cast<double>(now.prefix_cache_queries_tokens);
  M3_LOG_INFO(
      "prompt throughput {:.1f} tok/s, generation {:.1f} tok/s, running {}, waiting {}, "
      "KV usage {:.1f}%, prefix cache hit rate {:.1f}%",
      (now.prompt_tokens_total - before.prompt_tokens_total) / seconds,
      (now.generation_tokens_total - before.generation_tokens_total) / seconds, now.num_running,
      now.num_waiting, 100.0 * now.kv_usage,
      queries > 0 ? 100.0 * static_cast<double>(now.prefix_cache_hits_tokens) / queries : 0.0);
  // Speculative decoding over the interval, as vLLM logs it: mean acceptance length (the target's
  // own token counted), drafted and accepted tokens, acceptance rate by position.
  const uint64_t steps = now.spec_num_drafts - before.spec_num_drafts;
  if (steps == 0) return;
  const uint64_t drafted = now.spec_num_draft_tokens - before.spec_num_draft_tokens;
  const uint64_t accepted = now.spec_num_accepted_tokens - before.spec_num_accepted_tokens;
  std::string per_pos;
  for (size_t i = 0; i < now.spec_accepted_per_pos.size(); ++i) {
    const uint64_t b = i < before.spec_accepted_per_pos.size() ? before.spec_accepted_per_pos[i] : 0;
    per_pos += fmt::format("{}{:.3f}", i ? ", " : "", double(now.spec_accepted_per_pos[i] - b) / double(steps));
  }
  const std::string adaptive =
      now.spec_adaptive_verification
          ? fmt::format("; adaptive verification left out {} drafts (threshold {:.3f})",
                        now.spec_num_unverified_draft_tokens - before.spec_num_unverified_draft_tokens,
                        now.spec_verify_threshold)
          : "";
  M3_LOG_INFO("speculative decoding: mean acceptance length {:.2f}, accepted {} of {} drafted tokens ({:.1f}%), "
              "per-position acceptance rate {}{}",
              1.0 + double(accepted) / double(steps), accepted, drafted,
              drafted ? 100.0 * double(accepted) / double(drafted) : 0.0, per_pos, adaptive);
}

void run_serve(ServeArgs& a) {
  set_log_level(parse_log_level(a.log_level));
  if (!a.model_positional.empty()) {
    M3_CHECK(a.model.model_dir.empty() || a.model.model_dir == a.model_positional,
             "the model is given twice ('{}' and --model '{}')", a.model_positional,
             a.model.model_dir);
    a.model.model_dir = a.model_positional;
  }
  M3_CHECK(!a.model.model_dir.empty(), "serve needs a model: m3serve serve MODEL [options] (a directory or a "
           "Hugging Face repo id)");
  // Clients name the model as it was given (a repo id stays a repo id), as in vLLM.
  const std::string model_name = a.model.model_dir;
  // Options that cannot be honoured fail before a repo id is looked up (or downloaded).
  check_deployment_options(a.model, a.engine);
  locate_model(a.model);
  if (!a.tokenizer.empty()) {
    a.tokenizer = locate_model_dir(a.tokenizer, HubOptions{a.tokenizer_revision, a.model.hub.download_dir},
                                   hub::FileSet::kTokenizer, "--tokenizer");
  }
  log_vllm_compat_flags(a.compat);
  if (a.model.several_nodes() && a.model.node_rank > 0) {
    // A follower serves no HTTP: it loads its ranks (the same pool as node 0's) and runs node 0's steps.
    LoadedModel loaded = load_model(a.model, a.engine, KvDemand{a.engine.max_num_seqs, 0, true});
    return follow_node_zero(loaded, a.model, a.engine);
  }

  server::ServeOptions& serve = a.serve;
  serve.api_keys = a.api_keys;
  if (serve.api_keys.empty()) {
    if (const char* env = std::getenv("VLLM_API_KEY"); env && *env) serve.api_keys = {env};
  }
  if (serve.served_model_names.empty()) serve.served_model_names = {model_name};
  serve.model_path = model_name;
  serve.version = M3SERVE_VERSION;
  serve.http.max_body_bytes =
      static_cast<size_t>(parse_memory_size(a.max_body_size, "--max-body-size"));
  serve.http.max_header_bytes =
      static_cast<size_t>(parse_memory_size(a.max_header_size, "--max-header-size"));
  if (!serve.reasoning_parser.empty()) text::ReasoningParser check(serve.reasoning_parser);
  if (!serve.tool_call_parser.empty()) text::ToolCallParser check(serve.tool_call_parser, nullptr);
  M3_CHECK(!serve.enable_auto_tool_choice || !serve.tool_call_parser.empty(),
           "--enable-auto-tool-choice needs --tool-call-parser (e.g. minimax_m3)");

  SignalWatcher signals;  // before any thread starts, so every thread inherits the mask
  server::OpenAIServer server(serve);
  const int port = server.start();
  const char* scheme = serve.http.ssl_certfile.empty() ? "http" : "https";
  M3_LOG_INFO("listening on {}://{}:{} (loading the model; /health answers 503 until ready)",
              scheme, serve.host, port);

  // The KV pool: on the GPU what --gpu-memory-utilization leaves (as vLLM); on the CPU room for
  // --max-num-seqs full-length requests within the CPU budget.
  LoadedModel loaded = load_model(a.model, a.engine, KvDemand{a.engine.max_num_seqs, 0, true});
  std::unique_ptr<EngineCore> engine = make_engine(loaded, a.model, a.engine);
  // The chat template comes with the tokenizer (tokenizer_config.json), as in vLLM.
  const std::string tokenizer_dir = a.tokenizer.empty() ? a.model.model_dir : a.tokenizer;
  text::Tokenizer tokenizer = text::Tokenizer::load(tokenizer_dir);
  if (!a.tokenizer.empty()) M3_LOG_INFO("tokenizer and chat template from {}", tokenizer_dir);
  auto context = std::make_shared<server::ModelContext>(
      server::ModelContext{tokenizer,
                           load_chat_template(a.chat_template, tokenizer_dir, tokenizer),
                           engine.get(),
                           server::load_generation_defaults(a.generation_config, a.model.model_dir),
                           {},
                           engine->max_model_len(),
                           engine->vocab_size(),
                           server::CacheConfigInfo{engine->block_size(), a.model.kv_cache_dtype,
                                                   a.engine.enable_prefix_caching,
                                                   a.model.gpu_memory_utilization.value_or(0.9),
                                                   engine->kv_capacity_tokens() / engine->block_size()}});
  // Stop on the config's eos ids, generation_config's and the tokenizer's (vLLM takes the union).
  auto add_eos = [&](int32_t id) {
    auto& ids = context->eos_token_ids;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  for (int32_t id : loaded.model().config().eos_token_ids) add_eos(id);
  for (int32_t id : context->defaults.eos_token_ids) add_eos(id);
  if (auto id = tokenizer.eos_token_id()) add_eos(*id);
  M3_CHECK(tokenizer.vocab_size() <= engine->vocab_size(),
           "{}: the tokenizer has {} tokens but the model only {} logits", tokenizer_dir,
           tokenizer.vocab_size(), engine->vocab_size());
  if (!context->defaults.source.empty()) {
    M3_LOG_INFO("default sampling parameters from {}", context->defaults.source);
  }

  engine->start();
  server.set_model(context);
  signals.start_draining_on_signal();
  M3_LOG_INFO("ready: serving '{}' on {}://{}:{}", server.context().model_name(), scheme,
              serve.host, port);

  EngineStats last = engine->stats();
  auto last_time = std::chrono::steady_clock::now();
  std::optional<std::string> lost;
  // Stats every 10 s; a lost node (several hosts) is looked for every half second.
  while (signals.wait_for(1, std::chrono::milliseconds(500)) == 0) {
    if ((lost = loaded.lost_node())) break;
    auto now_time = std::chrono::steady_clock::now();
    if (a.disable_log_stats || now_time - last_time < std::chrono::seconds(10)) continue;
    EngineStats now = engine->stats();
    log_stats(now, last, std::chrono::duration<double>(now_time - last_time).count());
    last = now;
    last_time = now_time;
  }
  if (lost) {
    // The lost node's ranks held part of every step: nothing can be served any more. Stop now,
    // failing what is in flight, and exit non-zero so a supervisor restarts the deployment.
    M3_LOG_ERROR("a node of the deployment is lost ({}): stopping the server", *lost);
    server.drain_and_stop(std::chrono::seconds(0), [&] { engine->shutdown(false); });
    engine->shutdown(false);
    fail("a node of the deployment is lost, so the server stopped: {}", *lost);
  }
  M3_LOG_INFO(
      "{}: draining (new requests get 503; in-flight requests may finish for up to {} s; "
      "a second signal aborts them)",
      signals.last_name(), a.shutdown_timeout_s);
  std::atomic<bool> drained{false};
  std::thread second_signal([&] {
    while (!drained) {
      if (signals.wait_for(2, std::chrono::milliseconds(100)) >= 2) {
        M3_LOG_WARN("second signal: aborting requests in flight");
        engine->shutdown(false);
        return;
      }
    }
  });
  server.drain_and_stop(std::chrono::seconds(a.shutdown_timeout_s),
                        [&] { engine->shutdown(false); });
  drained = true;
  second_signal.join();
  engine->shutdown(true);
  M3_LOG_INFO("stopped");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  ServeArgs& a = *args;
  auto* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server (a drop-in for `vllm serve`)");
  cmd->add_option("model_tag", a.model_positional,
                  "model directory or Hugging Face repo id (org/name; or use --model)");
  add_model_options(*cmd, a.model);
  cmd->get_option("--model")->required(false);

  // Server.
  cmd->add_option("--host", a.serve.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", a.serve.port, "port to listen on (0: any free port)")
      ->capture_default_str();
  cmd->add_option("--api-key", a.api_keys,
                  "require 'Authorization: Bearer KEY' on /v1 (repeatable; "
                  "default: $VLLM_API_KEY)");
  cmd->add_option("--served-model-name", a.serve.served_model_names,
                  "model name(s) clients use; the first is reported (default: the model path)");
  cmd->add_option("--max-body-size", a.max_body_size, "largest request body (413 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-header-size", a.max_header_size,
                  "largest total request headers (431 beyond)")
      ->capture_default_str();
  cmd->add_option("--max-connections", a.serve.http.max_connections,
                  "open connections at most, idle ones included (503 beyond); connections are "
                  "not threads, and streams beyond --max-num-seqs queue in the engine")
      ->capture_default_str();
  cmd->add_option("--ssl-certfile", a.serve.http.ssl_certfile,
                  "serve HTTPS: the certificate chain (PEM); needs --ssl-keyfile");
  cmd->add_option("--ssl-keyfile", a.serve.http.ssl_keyfile,
                  "serve HTTPS: the private key (PEM); needs --ssl-certfile");
  cmd->add_option("--request-head-timeout", a.serve.http.head_timeout_s,
                  "seconds a request's head may take to arrive, from its first byte (408 beyond)")
      ->capture_default_str();
  cmd->add_option("--request-body-timeout", a.serve.http.body_timeout_s,
                  "seconds a request's body may take to arrive, after its head (408 beyond)")
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", a.serve.http.keep_alive_timeout_s,
                  "seconds an idle keep-alive connection stays open")
      ->capture_default_str();
  cmd->add_option("--stream-stall-timeout", a.serve.http.stream_stall_timeout_s,
                  "seconds a client may take no response bytes before it is dropped and its "
                  "request aborted")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", a.shutdown_timeout_s,
                  "seconds in-flight requests may take to finish on SIGINT/SIGTERM")
      ->capture_default_str();
  cmd->add_option("--max-logprobs", a.serve.request_limits.max_logprobs,
                  "largest logprobs / top_logprobs")
      ->capture_default_str();
  cmd->add_option("--log-level", a.log_level, "debug, info, warn or error")->capture_default_str();
  cmd->add_flag("--disable-log-stats", a.disable_log_stats, "no periodic throughput log");
  cmd->add_flag("--enable-prompt-tokens-details", a.serve.enable_prompt_tokens_details,
                "report usage.prompt_tokens_details.cached_tokens (prompt tokens served by the prefix cache); "
                "without it prompt_tokens_details is null, as in vLLM");

  // Chat and parsers.
  cmd->add_option("--chat-template", a.chat_template,
                  "chat template file or text (default: the tokenizer's)");
  cmd->add_option("--tokenizer", a.tokenizer,
                  "folder with the tokenizer files (tokenizer.json, tokenizer_config.json and its chat template) "
                  "to use instead of the model's, or a Hugging Face repo id holding them");
  cmd->add_option("--tokenizer-revision", a.tokenizer_revision,
                  "with a --tokenizer repo id: its branch, tag or commit hash (default main)");
  cmd->add_option("--generation-config", a.generation_config,
                  "'auto' (the model's generation_config.json), 'vllm' (none), or a folder")
      ->capture_default_str();
  cmd->add_option("--reasoning-parser", a.serve.reasoning_parser,
                  "split reasoning from content: minimax_m3, minimax_m2, minimax_m2_append_think");
  cmd->add_option("--tool-call-parser", a.serve.tool_call_parser,
                  "tool-call format: minimax_m3, minimax_m2");
  cmd->add_flag("--enable-auto-tool-choice", a.serve.enable_auto_tool_choice,
                "let the model decide to call tools (tool_choice 'auto')");
  cmd->add_option("--max-stored-responses", a.serve.response_store.max_entries,
                  "/v1/responses kept in memory for previous_response_id and GET (least "
                  "recently used out first; 0 stores none)")
      ->capture_default_str();
  cmd->add_option("--max-stored-response-bytes", a.serve.response_store.max_bytes,
                  "bytes of JSON the stored /v1/responses may hold together")
      ->capture_default_str();

  // Engine and deployment.
  add_engine_options(*cmd, a.engine);
  add_vllm_compat_flags(*cmd, a.compat);

  cmd->callback([args] { run_serve(*args); });
}

void expand_vllm_short_options(int argc, char** argv) {
  // vLLM spells the tensor-parallel option "-tp"; CLI11 would read that as "-t p". Every command
  // that takes the parallel options (serve, generate, score, bench, plan) gets it rewritten.
  static char kLongName[] = "--tensor-parallel-size";
  static const std::string_view kCommands[] = {"serve", "generate", "score", "bench", "plan"};
  if (argc < 2 || std::find(std::begin(kCommands), std::end(kCommands), std::string_view(argv[1])) == std::end(kCommands))
    return;
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "-tp") argv[i] = kLongName;
  }
}

}  // namespace m3::app
