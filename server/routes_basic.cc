// Service routes: health and readiness, version, the model list, Prometheus metrics.
#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <string_view>

#include "server/api_error.h"
#include "server/http_server.h"
#include "server/openai_response.h"
#include "server/route_common.h"
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

constexpr std::string_view kModelsPath = "/v1/models";

// A served name as /v1/models lists it: vLLM's fields, and Anthropic's (type, display_name,
// created_at), so both SDKs' models.list and models.retrieve read it.
nlohmann::json model_card(ServerContext& context, const std::string& name) {
  auto model = context.model();
  const std::time_t created = static_cast<std::time_t>(context.start_time());
  return {{"id", name},
          {"object", "model"},
          {"created", context.start_time()},
          {"owned_by", "m3serve"},
          {"root", context.options().model_path},
          {"parent", nullptr},
          {"max_model_len", model ? nlohmann::json(model->max_model_len) : nlohmann::json(nullptr)},
          {"permission", nlohmann::json::array()},
          {"type", "model"},
          {"display_name", name},
          {"created_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(created))}};
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
    nlohmann::json data = nlohmann::json::array();
    for (const std::string& name : context.options().served_model_names) data.push_back(model_card(context, name));
    // Anthropic's page fields too: every served name fits one page.
    const auto& names = context.options().served_model_names;
    send_json(res, dump_json({{"object", "list"},
                              {"data", std::move(data)},
                              {"has_more", false},
                              {"first_id", names.empty() ? nlohmann::json(nullptr) : nlohmann::json(names.front())},
                              {"last_id", names.empty() ? nlohmann::json(nullptr) : nlohmann::json(names.back())}}));
  });
  // OpenAI's "retrieve model" (the SDKs' models.retrieve); a served name may hold slashes, sent
  // as they are or as %2F.
  http.get(std::string(kModelsPath) + "/{...}", [&](const HttpRequest& req, HttpResponse& res) {
    const std::string name = path_segments_decoded(std::string_view(req.path).substr(kModelsPath.size() + 1), "model");
    const auto& names = context.options().served_model_names;
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      throw ApiError(404, fmt::format("The model `{}` does not exist.", name), "model");
    }
    send_json(res, dump_json(model_card(context, name)));
  });

  http.get("/metrics", [&](const HttpRequest&, HttpResponse& res) {
    auto model = context.model();
    EngineStats stats = model && model->engine ? model->engine->stats() : EngineStats{};
    const CacheConfigInfo* cache = model && model->cache_config ? &*model->cache_config : nullptr;
    res.set_content(context.metrics().render(stats, cache), "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace m3::server
