#include "server/sampling_params.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "server/api_error.h"

namespace m3::server {
namespace {

std::optional<double> number_field(const nlohmann::json& json, const char* key,
                                   const std::string& source) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return std::nullopt;
  M3_CHECK(it->is_number(), "{}: '{}' must be a number", source, key);
  return it->get<double>();
}

}  // namespace

GenerationDefaults load_generation_defaults(const std::string& setting,
                                            const std::filesystem::path& model_dir) {
  GenerationDefaults defaults;
  if (setting == "vllm" || setting == "none") return defaults;
  std::filesystem::path path = (setting == "auto" || setting.empty())
                                   ? model_dir / "generation_config.json"
                                   : std::filesystem::path(setting) / "generation_config.json";
  if (!std::filesystem::exists(path)) {
    M3_CHECK(setting == "auto" || setting.empty(),
             "--generation-config {}: no generation_config.json in that folder", setting);
    return defaults;
  }
  std::ifstream in(path);
  M3_CHECK(in.good(), "cannot read {}", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json json = nlohmann::json::parse(buffer.str(), nullptr, false);
  M3_CHECK(!json.is_discarded() && json.is_object(), "{}: not a JSON object", path.string());
  const std::string source = path.string();
  defaults.source = source;
  defaults.temperature = number_field(json, "temperature", source);
  defaults.top_p = number_field(json, "top_p", source);
  defaults.min_p = number_field(json, "min_p", source);
  defaults.repetition_penalty = number_field(json, "repetition_penalty", source);
  if (auto top_k = number_field(json, "top_k", source))
    defaults.top_k = static_cast<int64_t>(*top_k);
  if (auto max_new = number_field(json, "max_new_tokens", source)) {
    defaults.max_new_tokens = static_cast<int64_t>(*max_new);
  }
  if (auto it = json.find("eos_token_id"); it != json.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      defaults.eos_token_ids.push_back(it->get<int32_t>());
    } else {
      M3_CHECK(it->is_array(), "{}: 'eos_token_id' must be an integer or a list", source);
      for (const auto& id : *it) {
        M3_CHECK(id.is_number_integer(), "{}: 'eos_token_id' entries must be integers", source);
        defaults.eos_token_ids.push_back(id.get<int32_t>());
      }
    }
  }
  return defaults;
}

SamplingParams make_sampling_params(const CommonRequest& request,
                                    const GenerationDefaults& defaults, int max_tokens, int vocab_size) {
  const SamplingRequest& s = request.sampling;
  SamplingParams p;
  if (auto t = s.temperature ? s.temperature : defaults.temperature)
    p.temperature = static_cast<float>(*t);
  if (auto v = s.top_p ? s.top_p : defaults.top_p) p.top_p = static_cast<float>(*v);
  if (auto v = s.min_p ? s.min_p : defaults.min_p) p.min_p = static_cast<float>(*v);
  if (auto v = s.top_k ? s.top_k : defaults.top_k) p.top_k = static_cast<int>(*v);
  if (auto v = s.repetition_penalty ? s.repetition_penalty : defaults.repetition_penalty) {
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (s.presence_penalty) p.presence_penalty = static_cast<float>(*s.presence_penalty);
  if (s.frequency_penalty) p.frequency_penalty = static_cast<float>(*s.frequency_penalty);
  p.seed = s.seed;
  p.max_tokens = max_tokens;
  p.min_tokens = static_cast<int>(std::min<int64_t>(request.min_tokens, max_tokens));
  p.stop_token_ids = request.stop_token_ids;
  p.ignore_eos = request.ignore_eos;
  p.logprobs = request.logprobs;
  p.prompt_logprobs = request.prompt_logprobs;
  for (const auto& [id, bias] : s.logit_bias) {
    if (id >= vocab_size) {
      bad_field(fmt::format("logit_bias.{}", id), "is not a token id of this model (its vocabulary has {})",
                vocab_size);
    }
    p.logit_bias_ids.push_back(id);
    p.logit_bias_values.push_back(static_cast<float>(bias));
  }
  return p;
}

}  // namespace m3::server
