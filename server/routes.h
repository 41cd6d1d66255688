// The HTTP routes of the OpenAI-compatible server, one file per concern:
//   routes_basic.cc        /health /ping /version /v1/models /metrics
//   routes_tokenize.cc     /tokenize /detokenize
//   completions_route.cc   /v1/completions
//   chat_route.cc          /v1/chat/completions
//   messages_route.cc      /v1/messages /v1/messages/count_tokens (Anthropic Messages API)
//   responses_route.cc     /v1/responses, GET and DELETE /v1/responses/{id}, its input_items
#pragma once

namespace m3::server {

class HttpServer;
class ServerContext;
struct HttpRequest;
struct HttpResponse;

void register_basic_routes(HttpServer& http, ServerContext& context);
void register_tokenize_routes(HttpServer& http, ServerContext& context);
void handle_completions(ServerContext& context, const HttpRequest& req, HttpResponse& res);
void handle_chat_completions(ServerContext& context, const HttpRequest& req, HttpResponse& res);
// Registers both Anthropic routes with Anthropic's error shape.
void register_messages_routes(HttpServer& http, ServerContext& context);
void register_responses_routes(HttpServer& http, ServerContext& context);

}  // namespace m3::server
