#include "app/serve_options.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "model/config.h"
#include "model/weight_footprint.h"
#include "parallel/layout.h"

namespace m3::app {

namespace {

void check_parallel_deployment(const ParallelConfig& p, const std::string& model_dir) {
  check_parallel_config(p);
  if (p.world_size() == 1) return;
  // The same validation as `m3serve plan`, before any thread starts; a Hugging Face repo id is
  // looked up after these checks (app/model_source.h), so it has no config here yet (the loader
  // checks it then).
  const std::filesystem::path config = std::filesystem::path(model_dir) / "config.json";
  if (std::filesystem::is_regular_file(config)) make_parallel_layout(p, model_geometry(load_model_config(model_dir)));
}

}  // namespace

void check_deployment_options(const ModelOptions& mo, const EngineOptions& eo) {
  check_parallel_deployment(mo.parallel, mo.model_dir);
  check_model_options(mo);
  check_engine_options(eo);
}

std::optional<text::ChatTemplate> load_chat_template(const std::string& setting,
                                                     const std::string& model_dir,
                                                     const text::Tokenizer& tokenizer) {
  if (setting.empty()) {
    try {
      return text::ChatTemplate::load(model_dir);
    } catch (const m3::Error& e) {
      M3_LOG_WARN(
          "no chat template: {}; /v1/chat/completions will answer 400 (pass --chat-template)",
          e.what());
      return std::nullopt;
    }
  }
  std::string source = setting;
  std::string origin = "--chat-template";
  if (std::filesystem::is_regular_file(setting)) {
    std::ifstream in(setting);
    std::stringstream buffer;
    buffer << in.rdbuf();
    source = buffer.str();
    origin = setting;
  } else {
    M3_CHECK(setting.find("{{") != std::string::npos || setting.find("{%") != std::string::npos,
             "--chat-template '{}': no such file, and it does not look like a Jinja template",
             setting);
  }
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  const auto& tokens = tokenizer.special_tokens();
  if (tokens.bos) special["bos_token"] = *tokens.bos;
  if (tokens.eos) special["eos_token"] = *tokens.eos;
  if (tokens.pad) special["pad_token"] = *tokens.pad;
  if (tokens.unk) special["unk_token"] = *tokens.unk;
  return text::ChatTemplate(source, origin, std::move(special));
}

}  // namespace m3::app
