// vLLM's /tokenize and /detokenize: a prompt (or chat messages through the template) to token
// ids, and ids back to text.
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/http_server.h"
#include "server/route_common.h"
#include "server/routes.h"

namespace m3::server {
namespace {

void tokenize(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto model = context.require_model();
  Json body = parse_json_body(req);
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  check_model_name(context, read_string(body, "model").value_or(""));
  const bool return_strs = read_bool(body, "return_token_strs").value_or(false);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    ChatRequest chat = parse_chat_request(body, context.options().request_limits);
    ids = build_chat_prompt(chat, *model).token_ids;
  } else {
    auto prompt = read_string(body, "prompt");
    if (!prompt) bad_field("prompt", "is required (or give 'messages')");
    ids = model->tokenizer.encode(*prompt, read_bool(body, "add_special_tokens").value_or(true));
  }
  nlohmann::json strs = nullptr;
  if (return_strs) {
    strs = nlohmann::json::array();
    for (int32_t id : ids) strs.push_back(model->tokenizer.id_to_token(id).value_or(""));
  }
  send_json(res, dump_json({{"count", ids.size()},
                            {"max_model_len", model->max_model_len},
                            {"tokens", ids},
                            {"token_strs", std::move(strs)}}));
}

void detokenize(ServerContext& context, const HttpRequest& req, HttpResponse& res) {
  auto model = context.require_model();
  Json body = parse_json_body(req);
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  check_model_name(context, read_string(body, "model").value_or(""));
  const Json* tokens = read_array(body, "tokens");
  if (!tokens) bad_field("tokens", "is required");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    std::string path = fmt::format("tokens[{}]", i);
    int64_t id = as_int((*tokens)[i], path);
    if (id < 0 || id >= model->vocab_size) {
      bad_field(path, "is {}, outside the vocabulary [0, {})", id, model->vocab_size);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  send_json(res, dump_json({{"prompt", model->tokenizer.decode(ids, false)}}));
}

}  // namespace

void register_tokenize_routes(HttpServer& http, ServerContext& context) {
  http.post("/tokenize", [&](const HttpRequest& req, HttpResponse& res) {
    tokenize(context, req, res);
  });
  http.post("/detokenize", [&](const HttpRequest& req, HttpResponse& res) {
    detokenize(context, req, res);
  });
}

}  // namespace m3::server
