// quantization_config -> QuantConfig for the schemas MiniMax-M3 checkpoints are published in:
// MiniMax's own mxfp8 (+ NVFP4 routed experts for M3.1), DeepSeek-style fp8, compressed-tensors
// (llm-compressor) and NVIDIA ModelOpt. Anything else is rejected naming the field.
#include <fmt/format.h>
#include <fnmatch.h>

#include <regex>

#include "core/error.h"
#include "core/log.h"
#include "model/config_fields.h"

namespace m3 {

std::string_view quant_scheme_name(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kNone:
      return "none";
    case QuantScheme::kFp8:
      return "fp8";
    case QuantScheme::kFp8Block:
      return "fp8-block128";
    case QuantScheme::kMxfp8:
      return "mxfp8";
    case QuantScheme::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

bool QuantConfig::is_ignored(const std::string& name) const {
  for (const auto& p : ignored_layers) {
    if (p.rfind("re:", 0) == 0) {
      // compressed-tensors: re.match, anchored at the start.
      try {
        if (std::regex_search(name, std::regex("^(?:" + p.substr(3) + ")"))) return true;
      } catch (const std::regex_error&) {
        fail("quantization_config: ignore pattern '{}' is not a valid regex", p);
      }
    } else if (p.find_first_of("*?[") != std::string::npos) {
      if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;  // ModelOpt wildcards
    } else if (name == p ||
               (name.size() > p.size() && name.ends_with(p) &&
                name[name.size() - p.size() - 1] == '.') ||
               (p.size() > name.size() && p.ends_with(name) &&
                p[p.size() - name.size() - 1] == '.')) {
      // Exact, or the same module under a different prefix (language_model.model. vs model.).
      return true;
    }
  }
  return false;
}

namespace config_detail {

namespace {

void read_ignored(const Fields& q, QuantConfig& out) {
  for (const char* key : {"ignored_layers", "ignore", "modules_to_not_convert", "exclude_modules"})
    if (auto list = q.opt_strings(key))
      out.ignored_layers.insert(out.ignored_layers.end(), list->begin(), list->end());
}

QuantScheme fp8_block_scheme(const Fields& q) {
  const nlohmann::json* block = q.raw("weight_block_size");
  if (!block) return QuantScheme::kFp8;
  auto is = [&](int a, int b) {
    return block->is_array() && block->size() == 2 && (*block)[0] == a && (*block)[1] == b;
  };
  if (is(1, 32)) {
    if (std::string s = q.get_string("scale_fmt", "ue8m0"); s != "ue8m0")
      q.reject("scale_fmt",
               fmt::format("'{}' is not supported with 1x32 blocks (only 'ue8m0')", s));
    return QuantScheme::kMxfp8;
  }
  if (is(128, 128)) return QuantScheme::kFp8Block;
  q.reject("weight_block_size",
           fmt::format("{} is not supported ([1, 32] MXFP8 or [128, 128])", block->dump()));
}

// MiniMax's moe_quant_algo / moe_quant_format: the routed experts' own scheme.
void read_moe_override(const Fields& q, QuantConfig& out) {
  if (!q.has("moe_quant_algo")) return;
  std::string algo = q.get_string("moe_quant_algo", "");
  std::string format = q.get_string("moe_quant_format", "");
  out.moe_format = format;
  if (algo == "NVFP4" || algo == "nvfp4") {
    if (!format.empty() && format != "nvfp4-pack-quantized")
      q.reject("moe_quant_format", fmt::format("'{}' is not supported with NVFP4 (only "
                                               "'nvfp4-pack-quantized')",
                                               format));
    out.expert_scheme = QuantScheme::kNvfp4;
  } else if (algo == "MXFP8" || algo == "mxfp8") {
    out.expert_scheme = QuantScheme::kMxfp8;
  } else {
    q.reject("moe_quant_algo", fmt::format("'{}' is not supported (NVFP4 or MXFP8)", algo));
  }
}

QuantScheme ct_weights_scheme(const Fields& weights) {
  int64_t bits = weights.get_int("num_bits", 8);
  std::string type = weights.get_string("type", "int");
  std::string strategy = weights.get_string("strategy", "tensor");
  if (bits == 4 && type == "float") {
    if (int64_t g = weights.get_int("group_size", 16); g != 16)
      weights.reject("group_size",
                     fmt::format("{} is not supported for 4-bit float (NVFP4 uses 16)", g));
    return QuantScheme::kNvfp4;
  }
  if (bits == 8 && type == "float") {
    if (strategy == "tensor") return QuantScheme::kFp8;
    if (strategy == "block") {
      auto block = weights.raw("block_structure");
      if (block && *block == nlohmann::json::array({128, 128})) return QuantScheme::kFp8Block;
      weights.reject("block_structure", "only [128, 128] blocks are supported");
    }
    weights.reject(
        "strategy",
        fmt::format("'{}' is not supported for fp8 weights (tensor or block)", strategy));
  }
  weights.reject("num_bits", fmt::format("{}-bit {} weights are not supported (4-bit float = "
                                         "NVFP4, 8-bit float = FP8)",
                                         bits, type));
}

void parse_compressed_tensors(const Fields& q, QuantConfig& out) {
  std::string top_format = q.get_string("format", "");
  std::optional<Fields> groups = q.opt_object("config_groups");
  if (!groups) q.reject("config_groups", "missing (required for compressed-tensors)");
  std::optional<QuantScheme> general, experts;
  std::string expert_format;
  const nlohmann::json* groups_json = q.raw("config_groups");
  for (const auto& [group_name, group_value] : groups_json->items()) {
    std::optional<Fields> g = groups->opt_object(group_name.c_str());
    if (!g) continue;
    std::optional<Fields> weights = g->opt_object("weights");
    if (!weights) g->reject("weights", "missing");
    QuantScheme scheme = ct_weights_scheme(*weights);
    std::string format = g->get_string("format", top_format);
    if (scheme == QuantScheme::kNvfp4 && !format.empty() && format != "nvfp4-pack-quantized" &&
        format != "mixed-precision")
      g->reject("format", fmt::format("'{}' is not supported for NVFP4 weights", format));
    std::vector<std::string> targets =
        g->opt_strings("targets").value_or(std::vector<std::string>{"Linear"});
    bool only_experts = !targets.empty();
    for (const auto& target : targets) only_experts &= target.find("expert") != std::string::npos;
    if (only_experts) {
      experts = scheme;
      expert_format = format;
    } else {
      general = scheme;
      if (expert_format.empty()) expert_format = format;
    }
  }
  out.linear_scheme = general.value_or(QuantScheme::kNone);
  out.expert_scheme = experts ? *experts : out.linear_scheme;
  out.moe_format = expert_format;
}

QuantScheme modelopt_algo(const Fields& f, const char* key) {
  std::string algo = f.get_string(key, "");
  if (algo == "NVFP4") return QuantScheme::kNvfp4;
  if (algo == "FP8") return QuantScheme::kFp8;
  if (algo == "MXFP8") return QuantScheme::kMxfp8;
  f.reject(key, fmt::format("'{}' is not supported (NVFP4, FP8, MXFP8 or MIXED_PRECISION)", algo));
}

void parse_modelopt(const Fields& outer, QuantConfig& out) {
  // config.json carries the fields directly; hf_quant_config.json nests them under "quantization".
  std::optional<Fields> nested = outer.opt_object("quantization");
  const Fields& q = nested ? *nested : outer;
  read_ignored(q, out);
  out.nvfp4_modelopt = true;
  std::string algo = q.get_string("quant_algo", "");
  if (algo != "MIXED_PRECISION") {
    out.linear_scheme = out.expert_scheme = modelopt_algo(q, "quant_algo");
    if (out.linear_scheme == QuantScheme::kNvfp4) {
      if (int64_t g = q.get_int("group_size", 16); g != 16)
        q.reject("group_size", fmt::format("{} is not supported for NVFP4 (16)", g));
    }
    return;
  }
  std::optional<Fields> layers = q.opt_object("quantized_layers");
  if (!layers) q.reject("quantized_layers", "missing (required with quant_algo MIXED_PRECISION)");
  std::optional<QuantScheme> linear, experts;
  for (const auto& [name, value] : q.raw("quantized_layers")->items()) {
    std::optional<Fields> layer = layers->opt_object(name.c_str());
    if (!layer) continue;
    QuantScheme s = modelopt_algo(*layer, "quant_algo");
    std::optional<QuantScheme>& slot = name.find("experts.") != std::string::npos &&
                                               name.find("shared_experts") == std::string::npos
                                           ? experts
                                           : linear;
    if (slot && *slot != s)
      M3_LOG_DEBUG("{}: {} mixes {} and {}; each tensor's own format is loaded", q.source(),
                   layers->name(name.c_str()), quant_scheme_name(*slot), quant_scheme_name(s));
    if (!slot) slot = s;
  }
  out.linear_scheme = linear.value_or(QuantScheme::kNone);
  out.expert_scheme = experts.value_or(out.linear_scheme);
}

}  // namespace

QuantConfig parse_quant_config(const Fields& q) {
  QuantConfig out;
  if (!q.has("quant_method")) q.reject("quant_method", "missing (required in quantization_config)");
  out.method = q.get_string("quant_method", "");
  if (out.method == "mxfp8") {
    if (std::string f = q.get_string("fmt", "e4m3"); f != "e4m3")
      q.reject("fmt", fmt::format("'{}' is not supported (only 'e4m3')", f));
    if (q.has("weight_block_size") && fp8_block_scheme(q) != QuantScheme::kMxfp8)
      q.reject("weight_block_size", "mxfp8 requires [1, 32]");
    if (std::string s = q.get_string("scale_fmt", "ue8m0"); s != "ue8m0")
      q.reject("scale_fmt", fmt::format("'{}' is not supported (only 'ue8m0')", s));
    out.linear_scheme = out.expert_scheme = QuantScheme::kMxfp8;
    read_ignored(q, out);
    read_moe_override(q, out);
  } else if (out.method == "fp8") {
    if (std::string f = q.get_string("fmt", "e4m3"); f != "e4m3")
      q.reject("fmt", fmt::format("'{}' is not supported (only 'e4m3')", f));
    out.linear_scheme = out.expert_scheme = fp8_block_scheme(q);
    read_ignored(q, out);
    read_moe_override(q, out);
  } else if (out.method == "compressed-tensors") {
    read_ignored(q, out);
    parse_compressed_tensors(q, out);
  } else if (out.method == "modelopt") {
    parse_modelopt(q, out);
  } else {
    q.reject("quant_method", fmt::format("'{}' is not supported (mxfp8, fp8, compressed-tensors, "
                                         "modelopt)",
                                         out.method));
  }
  return out;
}

}  // namespace config_detail
}  // namespace m3
