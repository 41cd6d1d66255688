// Internal to model/: typed reads of config.json fields whose errors name the file and the field
// path ("config.json: text_config.hidden_size: expected an integer, got \"6144\"").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace m3::config_detail {

class Fields {
 public:
  // `obj` must outlive this. `path` is the dotted prefix of its fields ("" or "text_config.").
  Fields(const nlohmann::json& obj, std::string source, std::string path);

  // Present and not null. The reference treats an explicit null like an absent optional field.
  bool has(const char* key) const;
  // The key is written at all, even as null.
  bool present(const char* key) const;
  const nlohmann::json* raw(const char* key) const;  // null when absent or null
  std::string name(const char* key) const { return path_ + key; }
  const std::string& source() const { return source_; }

  int64_t get_int(const char* key, int64_t fallback) const;
  double get_number(const char* key, double fallback) const;
  bool get_bool(const char* key, bool fallback) const;
  std::string get_string(const char* key, const std::string& fallback) const;
  std::optional<int64_t> opt_int(const char* key) const;
  std::optional<double> opt_number(const char* key) const;
  // A list whose entries are truthy flags (ints or bools), as moe_layer_freq.
  std::optional<std::vector<bool>> opt_flags(const char* key) const;
  std::optional<std::vector<std::string>> opt_strings(const char* key) const;
  std::optional<Fields> opt_object(const char* key) const;

  [[noreturn]] void reject(const char* key, const std::string& why) const;

 private:
  const nlohmann::json* obj_;
  std::string source_;
  std::string path_;
};

// rope_parameters (or legacy rope_scaling / rope_theta / partial_rotary_factor) -> RopeConfig with
// inv_freq computed as modeling_rope_utils does. `text` is the text config object.
RopeConfig parse_rope(const Fields& text, int head_dim, int64_t max_position_embeddings,
                      const std::vector<std::string>& layer_type_names);

// quantization_config -> QuantConfig; unknown methods and schemes are rejected naming the field.
QuantConfig parse_quant_config(const Fields& quant);

}  // namespace m3::config_detail
