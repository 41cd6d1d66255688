#include "hub/needed_files.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

namespace m3::hub {
namespace {

namespace fs = std::filesystem;

constexpr std::array<std::string_view, 10> kTokenizerFiles = {
    "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json",   "vocab.json",              "merges.txt",
    "tokenizer.model",    "generation_config.json"};

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool is_needed(const std::string& path, FileSet set) {
  if (path.find('/') != std::string::npos) return false;  // the loaders read the top folder only
  if (set == FileSet::kConfig) return path == "config.json";
  for (std::string_view name : kTokenizerFiles) {
    if (path == name) return true;
  }
  if (set == FileSet::kTokenizer) return false;
  return path == "config.json" || ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json");
}

std::vector<std::string> missing_files(const fs::path& snapshot, FileSet set) {
  std::vector<std::string> missing;
  // exists() follows the symlinks: a link whose blob is gone counts as missing.
  if (set == FileSet::kTokenizer) {
    if (!fs::exists(snapshot / "tokenizer.json") && !fs::exists(snapshot / "tokenizer_config.json")) {
      missing.push_back("tokenizer.json");
    }
    return missing;
  }
  if (!fs::exists(snapshot / "config.json")) missing.push_back("config.json");
  if (set == FileSet::kConfig) return missing;
  const fs::path index_path = snapshot / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    const nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      missing.push_back("model.safetensors.index.json (unreadable)");
      return missing;
    }
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index["weight_map"].items()) {
      if (shard.is_string()) shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) {
      if (!fs::exists(snapshot / shard)) missing.push_back(shard);
    }
    return missing;
  }
  bool any_weights = false;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(snapshot, ec)) {
    any_weights |= ends_with(entry.path().filename().string(), ".safetensors") && fs::exists(entry.path());
  }
  if (!any_weights) missing.push_back("*.safetensors");
  return missing;
}

}  // namespace m3::hub
