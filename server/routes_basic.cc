// Service routes: health and readiness, version, the model list, Prometheus metrics.
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/openai_response.h"
#include "server/routes.h"
#include "server/server_context.h"

namespace m3::server {
namespace {

void health(ServerContext& context, HttpResponse& res) {
  if (context.draining()) {
    send_error(res, 503, "the server is shutting down");
  } else if (!context.model()) {
    send_error(res, 503, "the model is still loading");
  } else {
    res.status = 200;  // vLLM answers an empty 200
  }
}

}  // namespace

void register_basic_routes(HttpServer& http, ServerContext& context) {
  http.get("/health",
           [&](const HttpRequest&, HttpResponse& res) { health(context, res); });
  http.get("/ping", [&](const HttpRequest&, HttpResponse& res) { health(context, res); });
  http.post("/ping",
            [&](const HttpRequest&, HttpResponse& res) { health(context, res); });

  http.get("/version", [&](const HttpRequest&, HttpResponse& res) {
    send_json(res, dump_json({{"version", context.options().version}}));
  });

  http.get("/v1/models", [&](const HttpRequest&, HttpResponse& res) {
    auto model = context.model();
    nlohmann::json data = nlohmann::json::array();
    for (const std::string& name : context.options().served_model_names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", context.start_time()},
                      {"owned_by", "m3serve"},
                      {"root", context.options().model_path},
                      {"parent", nullptr},
                      {"max_model_len",
                       model ? nlohmann::json(model->max_model_len) : nlohmann::json(nullptr)},
                      {"permission", nlohmann::json::array()}});
    }
    send_json(res, dump_json({{"object", "list"}, {"data", std::move(data)}}));
  });

  http.get("/metrics", [&](const HttpRequest&, HttpResponse& res) {
    auto model = context.model();
    EngineStats stats = model && model->engine ? model->engine->stats() : EngineStats{};
    const CacheConfigInfo* cache = model && model->cache_config ? &*model->cache_config : nullptr;
    res.set_content(context.metrics().render(stats, cache), "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace m3::server
