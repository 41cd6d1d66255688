#include "tests/server/scripted_server.h"

#include "core/error.h"
#include "server/sampling_params.h"
#include "tests/server/scripted_runner.h"
#include "text/chat_template.h"

namespace m3::testing {

ScriptedServer::ScriptedServer(ScriptedServerOptions options) : options_(std::move(options)) {
  tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::load(options_.model_dir));
  const text::Tokenizer& tok = *tokenizer_;
  std::vector<ScriptedReply> replies;
  for (const auto& [trigger, reply] : options_.replies) {
    replies.push_back({trigger.empty() ? std::vector<int32_t>{} : tok.encode(trigger, false),
                       tok.encode(reply, false)});
  }
  int32_t eos = tok.eos_token_id().value_or(0);
  auto runner = std::make_unique<ScriptedRunner>(
      tok.vocab_size(), options_.block_size, options_.num_kv_blocks,
      tok.encode(options_.marker, false), std::move(replies), eos);
  engine_ = std::make_unique<EngineCore>(std::move(runner), options_.engine);
  engine_->start();

  if (options_.serve.served_model_names.empty()) options_.serve.served_model_names = {"scripted"};
  options_.serve.host = "127.0.0.1";
  options_.serve.model_path = options_.model_dir.string();
  options_.serve.version = "test";
  server_ = std::make_unique<server::OpenAIServer>(options_.serve);
  port_ = server_->start();
  if (options_.load_model) publish_model();
}

void ScriptedServer::publish_model() {
  auto model = std::make_shared<server::ModelContext>(
      server::ModelContext{*tokenizer_,
                           text::ChatTemplate::load(options_.model_dir),
                           engine_.get(),
                           server::GenerationDefaults{},
                           {},
                           engine_->max_model_len(),
                           engine_->vocab_size()});
  if (auto eos = tokenizer_->eos_token_id()) model->eos_token_ids.push_back(*eos);
  server_->set_model(std::move(model));
}

ScriptedServer::~ScriptedServer() {
  server_->stop();
  engine_->shutdown(false);
}

}  // namespace m3::testing
