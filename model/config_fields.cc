#include "model/config_fields.h"

#include <fmt/format.h>

#include "core/error.h"

namespace m3::config_detail {

namespace {
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}
}  // namespace

Fields::Fields(const nlohmann::json& obj, std::string source, std::string path)
    : obj_(&obj), source_(std::move(source)), path_(std::move(path)) {}

const nlohmann::json* Fields::raw(const char* key) const {
  if (!obj_->is_object()) return nullptr;
  auto it = obj_->find(key);
  if (it == obj_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool Fields::has(const char* key) const { return raw(key) != nullptr; }

bool Fields::present(const char* key) const { return obj_->is_object() && obj_->contains(key); }

void Fields::reject(const char* key, const std::string& why) const {
  fail("{}: {}: {}", source_, name(key), why);
}

std::optional<int64_t> Fields::opt_int(const char* key) const {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  // 6144.0 is not an int to the reference's strict dataclass either.
  reject(key, fmt::format("expected an integer, got {}", shown(*v)));
}

std::optional<double> Fields::opt_number(const char* key) const {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  reject(key, fmt::format("expected a number, got {}", shown(*v)));
}

int64_t Fields::get_int(const char* key, int64_t fallback) const {
  return opt_int(key).value_or(fallback);
}

double Fields::get_number(const char* key, double fallback) const {
  return opt_number(key).value_or(fallback);
}

bool Fields::get_bool(const char* key, bool fallback) const {
  const nlohmann::json* v = raw(key);
  if (!v) return fallback;
  if (v->is_boolean()) return v->get<bool>();
  reject(key, fmt::format("expected true or false, got {}", shown(*v)));
}

std::string Fields::get_string(const char* key, const std::string& fallback) const {
  const nlohmann::json* v = raw(key);
  if (!v) return fallback;
  if (v->is_string()) return v->get<std::string>();
  reject(key, fmt::format("expected a string, got {}", shown(*v)));
}

std::optional<std::vector<bool>> Fields::opt_flags(const char* key) const {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) reject(key, fmt::format("expected a list of 0/1 flags, got {}", shown(*v)));
  std::vector<bool> out;
  for (const auto& e : *v) {
    if (e.is_boolean())
      out.push_back(e.get<bool>());
    else if (e.is_number_integer())
      out.push_back(e.get<int64_t>() != 0);
    else
      reject(key, fmt::format("expected a list of 0/1 flags, found {}", shown(e)));
  }
  return out;
}

std::optional<std::vector<std::string>> Fields::opt_strings(const char* key) const {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_array()) reject(key, fmt::format("expected a list of strings, got {}", shown(*v)));
  std::vector<std::string> out;
  for (const auto& e : *v) {
    if (!e.is_string()) reject(key, fmt::format("expected a list of strings, found {}", shown(e)));
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<Fields> Fields::opt_object(const char* key) const {
  const nlohmann::json* v = raw(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) reject(key, fmt::format("expected an object, got {}", shown(*v)));
  return Fields(*v, source_, path_ + key + ".");
}

}  // namespace m3::config_detail
