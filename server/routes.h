// The HTTP routes of the OpenAI-compatible server, one file per concern:
//   routes_basic.cc        /health /ping /version /v1/models /metrics
//   routes_tokenize.cc     /tokenize /detokenize
//   completions_route.cc   /v1/completions
//   chat_route.cc          /v1/chat/completions
#pragma once

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace m3::server {

class HttpServer;
class ServerContext;

void register_basic_routes(HttpServer& http, ServerContext& context);
void register_tokenize_routes(HttpServer& http, ServerContext& context);
void handle_completions(ServerContext& context, const httplib::Request& req,
                        httplib::Response& res);
void handle_chat_completions(ServerContext& context, const httplib::Request& req,
                             httplib::Response& res);

}  // namespace m3::server
