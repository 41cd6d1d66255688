// From an OpenAI request to the engine's SamplingParams: the client's values first, then the
// model's generation_config.json defaults (--generation-config, as vLLM applies them), then the
// engine's own defaults.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/openai_request.h"

namespace m3::server {

// The sampling fields of a generation_config.json that vLLM honours as defaults.
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_new_tokens;
  std::vector<int32_t> eos_token_ids;  // generation_config's eos_token_id (int or list)
  std::string source;                  // the file read, or empty when none
};

// `setting` is --generation-config: "auto" reads <model_dir>/generation_config.json when present,
// "vllm" (or "none") uses no defaults, anything else is a folder holding generation_config.json.
// A file that exists but is malformed is an m3::Error naming it and the field.
GenerationDefaults load_generation_defaults(const std::string& setting,
                                            const std::filesystem::path& model_dir);

// `max_tokens` is already resolved (client value or the room left in the context);
// `vocab_size` bounds the logit_bias ids (a 400 naming the one outside).
SamplingParams make_sampling_params(const CommonRequest& request, const GenerationDefaults& defaults, int max_tokens,
                                    int vocab_size);

}  // namespace m3::server
