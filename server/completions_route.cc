// POST /v1/completions: prompts (text or token ids, batched) -> n samples each, streamed over SSE
// or returned whole. Choices are prompt-major: choice index = prompt index * n + sample.
#include "core/log.h"
#include "server/api_error.h"
#include "server/response_session.h"
#include "server/route_common.h"
#include "server/routes.h"

namespace m3::server {
namespace {

ChoiceTextOptions text_options(const CompletionRequest& r) {
  ChoiceTextOptions o;
  o.skip_special_tokens = r.common.skip_special_tokens;
  o.stop = r.common.stop;
  o.include_stop_str_in_output = r.common.include_stop_str_in_output;
  return o;
}

class CompletionSession final : public ResponseSession {
 public:
  CompletionSession(ServerContext& context, std::shared_ptr<const ModelContext> model,
                    CompletionRequest request, GenerationJob::Clock::time_point arrival)
      : ResponseSession(context, std::move(model), "cmpl-", "text_completion", arrival),
        request_(std::move(request)) {}

  const CompletionRequest& request() const { return request_; }
  const TokenStrings& strings() const { return strings_; }
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> prompt_texts;  // for echo
  std::vector<std::unique_ptr<CompletionLogprobs>> logprobs;  // per choice, when requested
  std::vector<int64_t> text_offsets;       // characters of text already sent per choice (logprobs)
  std::vector<char> echo_sent;             // streaming echo: the prompt chunk went out
  bool prompt_logprobs_requested = false;  // by the client (echo + logprobs also asks the engine)

 private:
  const CommonRequest& common() const override { return request_.common; }

  // Echo: the prompt's logprob entries come first (the first prompt token has none).
  void add_echo_logprobs(int c) {
    ChoiceState& choice = *choices_[c];
    CompletionLogprobs& lp = *logprobs[c];
    const std::vector<int32_t>& ids = prompt_ids[choice.prompt_index];
    lp.add_unscored(ids.front());
    if (choice.prompt_logprobs) {
      for (const PositionLogprobs& p : *choice.prompt_logprobs) lp.add(p);
    }
  }

  nlohmann::json choice_json(int c, std::string text, bool final_chunk) {
    ChoiceState& choice = *choices_[c];
    nlohmann::json lp = nullptr;
    if (logprobs[c]) {
      for (const PositionLogprobs& p : choice.logprobs) logprobs[c]->add(p);
      choice.logprobs.clear();
      lp = logprobs[c]->take(text_offsets[c]);
      text_offsets[c] = logprobs[c]->text_length();
    }
    nlohmann::json out = {
        {"index", c},
        {"text", std::move(text)},
        {"logprobs", std::move(lp)},
        {"finish_reason", final_chunk ? nlohmann::json(choice.end.finish_reason) : nullptr},
        {"stop_reason", final_chunk ? choice.end.stop_reason : nullptr}};
    if (final_chunk && choice.prompt_logprobs && prompt_logprobs_requested) {
      out["prompt_logprobs"] = prompt_logprobs_json(*choice.prompt_logprobs, strings_);
    }
    if (final_chunk && request_.common.return_token_ids) {
      out["prompt_token_ids"] = prompt_ids[choice.prompt_index];
      out["token_ids"] = choice.output_ids;
    }
    return out;
  }

  void stream_event(const ChoiceEvent& event) override {
    const int c = event.choice;
    ChoiceState& choice = *choices_[c];
    if (request_.echo && !echo_sent[c]) {
      // Echo: the prompt goes first, as its own chunk, once its logprobs (delivered with the
      // first output) are known.
      echo_sent[c] = true;
      if (event.output.prompt_logprobs) choice.prompt_logprobs = event.output.prompt_logprobs;
      if (logprobs[c]) add_echo_logprobs(c);
      send_chunk(chunk(choice_json(c, prompt_texts[choice.prompt_index], false)), choice);
    }
    std::optional<ChoiceDelta> delta = apply(event);
    if (!delta) return;
    if (delta->content.empty() && choice.logprobs.empty() && !choice.ended) return;
    send_chunk(chunk(choice_json(c, std::move(delta->content), choice.ended)), choice);
  }

  void collect_event(const ChoiceEvent& event) override {
    if (texts_.size() < choices_.size()) texts_.resize(choices_.size());
    std::optional<ChoiceDelta> delta = apply(event);
    if (delta) texts_[event.choice] += delta->content;
  }

  nlohmann::json whole_body() override {
    texts_.resize(choices_.size());
    nlohmann::json body = envelope();
    body["choices"] = nlohmann::json::array();
    for (int c = 0; c < static_cast<int>(choices_.size()); ++c) {
      ChoiceState& choice = *choices_[c];
      if (logprobs[c] && request_.echo) add_echo_logprobs(c);
      std::string text =
          request_.echo ? prompt_texts[choice.prompt_index] + texts_[c] : texts_[c];
      body["choices"].push_back(choice_json(c, std::move(text), true));
    }
    body["usage"] = usage();
    return body;
  }

  CompletionRequest request_;
  std::vector<std::string> texts_;  // not streaming: each choice's text so far
};

}  // namespace

void handle_completions(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto arrival = GenerationJob::Clock::now();
  auto model = context.require_model();
  Json body = parse_json_body(req);
  CompletionRequest request = parse_completion_request(body, context.options().request_limits);
  check_model_name(context, request.common.model);
  const bool prompt_logprobs_requested = request.common.prompt_logprobs >= 0;
  // Echo with logprobs reports the prompt's logprobs too.
  if (request.echo && request.common.logprobs >= 0) {
    request.common.prompt_logprobs =
        std::max(request.common.prompt_logprobs, request.common.logprobs);
  }

  auto s = std::make_shared<CompletionSession>(context, model, std::move(request), arrival);
  const CompletionRequest& r = s->request();
  s->prompt_logprobs_requested = prompt_logprobs_requested;
  const std::string& request_id = s->id();

  std::vector<std::vector<EngineRequest>> engine_requests;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const PromptInput& prompt = r.prompts[p];
    std::string field = r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", p);
    std::vector<int32_t> ids = prompt.is_token_ids
                                   ? prompt.token_ids
                                   : model->tokenizer.encode(prompt.text, r.add_special_tokens);
    check_prompt_ids(ids, model->vocab_size, field);
    int max_tokens = resolve_max_tokens(r.common, *model, static_cast<int>(ids.size()), field);
    SamplingParams sampling = make_sampling_params(r.common, model->defaults, max_tokens, model->vocab_size);
    if (r.common.structured) {
      ConstraintCompiler::Target target;
      target.tokenizer = &model->tokenizer;
      target.vocab_size = model->vocab_size;
      target.eos_token_ids = model->eos_token_ids;
      target.special_tokens_visible = !r.common.skip_special_tokens;
      sampling.constraint = model->constraints->for_spec(*r.common.structured, target);
    }
    std::string prefix = r.prompts.size() == 1 ? request_id : fmt::format("{}-p{}", request_id, p);
    engine_requests.push_back(make_engine_requests(prefix, ids, sampling, r.common.n, *model));
    s->prompt_texts.push_back(prompt.is_token_ids ? model->tokenizer.decode(ids, false)
                                                  : prompt.text);
    s->prompt_ids.push_back(std::move(ids));
  }
  for (size_t p = 0; p < engine_requests.size(); ++p) {
    for (int j = 0; j < r.common.n; ++j) {
      auto choice = std::make_unique<ChoiceState>(model->tokenizer, text_options(r));
      choice->prompt_index = static_cast<int>(p);
      choice->prompt_tokens = static_cast<int>(s->prompt_ids[p].size());
      s->choices().push_back(std::move(choice));
      s->logprobs.push_back(r.common.logprobs >= 0 ? std::make_unique<CompletionLogprobs>(
                                                         s->strings(), r.common.logprobs)
                                                   : nullptr);
      s->text_offsets.push_back(0);
      s->echo_sent.push_back(0);
    }
  }
  for (auto& requests : engine_requests) s->job().submit(std::move(requests));
  M3_LOG_DEBUG("completion {}: {} prompt(s) x {}", request_id, r.prompts.size(), r.common.n);
  s->respond(req, res);
}

}  // namespace m3::server
