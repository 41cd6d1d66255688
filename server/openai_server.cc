#include "server/openai_server.h"

#include <thread>

#include "core/log.h"
#include "server/routes.h"

namespace m3::server {
namespace {

// vLLM authenticates the /v1 API; m3serve also guards the tokenizer routes, which run model
// code. Health, version and metrics stay open for probes and scrapers.
bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

}  // namespace

OpenAIServer::OpenAIServer(ServeOptions options)
    : context_(std::move(options)),
      http_(context_.options().http, context_.options().api_keys, needs_auth, &context_.metrics()) {
  register_basic_routes(http_, context_);
  register_tokenize_routes(http_, context_);
  http_.post("/v1/completions", [this](const HttpRequest& req, HttpResponse& res) {
    handle_completions(context_, req, res);
  });
  http_.post("/v1/chat/completions", [this](const HttpRequest& req, HttpResponse& res) {
    handle_chat_completions(context_, req, res);
  });
  register_messages_routes(http_, context_);
  register_responses_routes(http_, context_);
}

OpenAIServer::~OpenAIServer() { stop(); }

int OpenAIServer::start() { return http_.start(context_.options().host, context_.options().port); }

void OpenAIServer::set_model(std::shared_ptr<const ModelContext> model) {
  context_.set_model(std::move(model));
}

void OpenAIServer::drain_and_stop(std::chrono::milliseconds grace,
                                  const std::function<void()>& abort_in_flight) {
  using Clock = std::chrono::steady_clock;
  context_.begin_draining();
  auto wait_idle = [&](std::chrono::milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (context_.in_flight() > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return context_.in_flight() == 0;
  };
  if (context_.in_flight() > 0) {
    M3_LOG_INFO("draining {} request(s) in flight (up to {} ms)", context_.in_flight(),
                grace.count());
  }
  if (!wait_idle(grace)) {
    M3_LOG_WARN("{} request(s) still running after {} ms: aborting them", context_.in_flight(),
                grace.count());
    if (abort_in_flight) abort_in_flight();
    wait_idle(std::chrono::milliseconds(5000));
  }
  stop();
}

void OpenAIServer::stop() {
  http_.stop();
  // While the engine still exists: a background response still there aborts its job as it goes.
  context_.background_tasks().stop();
}

}  // namespace m3::server
