#include "engine/speculative_config.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace m3 {
namespace {

constexpr const char* kKeys[] = {"method",
                                 "model",
                                 "num_speculative_tokens",
                                 "draft_sample_method",
                                 "rejection_sample_method",
                                 "synthetic_acceptance_length",
                                 "synthetic_acceptance_rates",
                                 "kv_cache_dtype",
                                 "attention_backend",
                                 "prompt_lookup_min",
                                 "prompt_lookup_max",
                                 "disable_by_batch_size",
                                 "enable_adaptive_verification"};

// prompt_lookup_min / _max of the n-gram drafter: an integer in [1, 64], or `fallback` when absent.
int lookup_length(const nlohmann::json& spec, const char* key, int fallback) {
  if (!spec.contains(key)) return fallback;
  const nlohmann::json& v = spec.at(key);
  M3_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 64,
           "--speculative-config: {} must be an integer in [1, 64], got {}", key, v.dump());
  return v.get<int>();
}

std::string string_of(const nlohmann::json& spec, const char* key, const std::string& fallback) {
  if (!spec.contains(key)) return fallback;
  const nlohmann::json& v = spec.at(key);
  M3_CHECK(v.is_string(), "--speculative-config: {} must be a string, got {}", key, v.dump());
  return v.get<std::string>();
}

const char* rejection_name(RejectionMethod m) {
  switch (m) {
    case RejectionMethod::kStandard: return "standard";
    case RejectionMethod::kBlock: return "block";
    case RejectionMethod::kSynthetic: return "synthetic";
  }
  return "?";
}

}  // namespace

SpeculativeConfig parse_speculative_config(const std::string& json_text) {
  const nlohmann::json spec = nlohmann::json::parse(json_text, nullptr, false);
  M3_CHECK(!spec.is_discarded() && spec.is_object(), "--speculative-config must be a JSON object, got '{}'",
           json_text);
  for (const auto& [key, value] : spec.items()) {
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    M3_CHECK(known, "--speculative-config: unknown or unsupported key '{}' (m3serve takes: {})", key,
             fmt::join(kKeys, ", "));
  }
  SpeculativeConfig c;
  c.method = string_of(spec, "method", "");
  if (c.method == "[ngram]") c.method = "ngram";  // vLLM's older spelling
  M3_CHECK(c.method == "dspark" || c.method == "ngram",
           "--speculative-config: method '{}' is not supported (m3serve has: dspark, ngram)", c.method);
  c.model = string_of(spec, "model", "");
  if (c.method == "ngram") {
    for (const char* key : {"model", "kv_cache_dtype", "draft_sample_method"})
      M3_CHECK(!spec.contains(key), "--speculative-config: {} does not apply to method ngram (it has no drafter model)",
               key);
    // vLLM's defaults: both 5 when neither is given, else the one given for both.
    const bool has_min = spec.contains("prompt_lookup_min"), has_max = spec.contains("prompt_lookup_max");
    c.prompt_lookup_min = lookup_length(spec, "prompt_lookup_min", has_max ? lookup_length(spec, "prompt_lookup_max", 5) : 5);
    c.prompt_lookup_max = lookup_length(spec, "prompt_lookup_max", has_min ? c.prompt_lookup_min : 5);
    M3_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max,
             "--speculative-config: prompt_lookup_min {} is above prompt_lookup_max {}", c.prompt_lookup_min,
             c.prompt_lookup_max);
  } else {
    for (const char* key : {"prompt_lookup_min", "prompt_lookup_max"})
      M3_CHECK(!spec.contains(key), "--speculative-config: {} applies to method ngram only", key);
  }

  M3_CHECK(spec.contains("num_speculative_tokens"), "--speculative-config: num_speculative_tokens is required");
  const nlohmann::json& k = spec.at("num_speculative_tokens");
  M3_CHECK(k.is_number_integer() && k.get<int64_t>() >= 1 && k.get<int64_t>() <= 64,
           "--speculative-config: num_speculative_tokens must be an integer in [1, 64], got {}", k.dump());
  c.num_speculative_tokens = k.get<int>();

  const std::string draft = string_of(spec, "draft_sample_method", "greedy");
  M3_CHECK(draft == "greedy" || draft == "probabilistic",
           "--speculative-config: draft_sample_method '{}' (expected greedy or probabilistic)", draft);
  c.probabilistic_drafts = draft == "probabilistic";

  const std::string rejection = string_of(spec, "rejection_sample_method", "standard");
  if (rejection == "standard") c.rejection = RejectionMethod::kStandard;
  else if (rejection == "block") c.rejection = RejectionMethod::kBlock;
  else if (rejection == "synthetic") c.rejection = RejectionMethod::kSynthetic;
  else fail("--speculative-config: rejection_sample_method '{}' (expected standard, block or synthetic)", rejection);

  const bool has_length = spec.contains("synthetic_acceptance_length");
  const bool has_rates = spec.contains("synthetic_acceptance_rates");
  if (c.rejection != RejectionMethod::kSynthetic) {
    M3_CHECK(!has_length && !has_rates,
             "--speculative-config: synthetic_acceptance_* need rejection_sample_method synthetic (it is {})",
             rejection);
  } else {
    M3_CHECK(has_length != has_rates,
             "--speculative-config: synthetic verification needs exactly one of synthetic_acceptance_length "
             "and synthetic_acceptance_rates");
    if (has_length) {
      const nlohmann::json& l = spec.at("synthetic_acceptance_length");
      M3_CHECK(l.is_number(), "--speculative-config: synthetic_acceptance_length must be a number, got {}", l.dump());
      c.synthetic_rates = synthetic_rates_for_length(l.get<double>(), c.num_speculative_tokens);
    } else {
      const nlohmann::json& r = spec.at("synthetic_acceptance_rates");
      M3_CHECK(r.is_array() && r.size() == static_cast<size_t>(c.num_speculative_tokens),
               "--speculative-config: synthetic_acceptance_rates must be a list of {} rates (one per "
               "speculative token), got {}",
               c.num_speculative_tokens, r.dump());
      for (const nlohmann::json& x : r) {
        M3_CHECK(x.is_number() && x.get<double>() >= 0.0 && x.get<double>() <= 1.0,
                 "--speculative-config: synthetic_acceptance_rates holds {}, not a rate in [0, 1]", x.dump());
        c.synthetic_rates.push_back(x.get<float>());
      }
    }
  }

  const std::string kv = string_of(spec, "kv_cache_dtype", "auto");
  if (kv != "auto") {
    try {
      c.kv_cache_dtype = parse_kv_dtype(kv);
    } catch (const Error& e) {
      fail("--speculative-config: kv_cache_dtype: {}", e.what());
    }
  }
  c.attention_backend = string_of(spec, "attention_backend", "");
  if (spec.contains("disable_by_batch_size")) {
    const nlohmann::json& v = spec.at("disable_by_batch_size");
    M3_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= (int64_t(1) << 30),
             "--speculative-config: disable_by_batch_size must be an integer >= 1, got {}", v.dump());
    c.disable_by_batch_size = v.get<int>();
  }
  if (spec.contains("enable_adaptive_verification")) {
    const nlohmann::json& v = spec.at("enable_adaptive_verification");
    M3_CHECK(v.is_boolean(), "--speculative-config: enable_adaptive_verification must be true or false, got {}",
             v.dump());
    c.adaptive_verification = v.get<bool>();
    M3_CHECK(!c.adaptive_verification || c.method == "dspark",
             "--speculative-config: enable_adaptive_verification needs method dspark (it cuts drafts by the "
             "drafter's confidence head; {} has none)",
             c.method);
  }
  return c;
}

std::string SpeculativeConfig::summary() const {
  const std::string limit =
      disable_by_batch_size ? fmt::format(", off above {} running requests", *disable_by_batch_size) : "";
  if (method == "ngram") {
    return fmt::format("ngram, k={}, n-grams of {} to {} tokens, {} verification{}", num_speculative_tokens,
                       prompt_lookup_min, prompt_lookup_max, rejection_name(rejection), limit);
  }
  return fmt::format("{}, k={}, {} drafts, {}{} verification, {} drafter cache{}{}", method, num_speculative_tokens,
                     probabilistic_drafts ? "probabilistic" : "greedy", adaptive_verification ? "adaptive " : "",
                     rejection_name(rejection),
                     kv_cache_dtype ? std::string(kv_dtype_name(*kv_cache_dtype)) : std::string("float32"),
                     model.empty() ? "" : ", drafter " + model, limit);
}

}  // namespace m3
