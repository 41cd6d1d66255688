// Hugging Face repository ids ("org/name", or a bare "name"), with huggingface_hub's rules.
#pragma once
#include <optional>
#include <string>

namespace m3::hub {

struct RepoId {
  std::string owner;  // empty for a bare name such as "gpt2"
  std::string name;

  std::string str() const { return owner.empty() ? name : owner + "/" + name; }
  // The repository's folder in the cache: models--{owner}--{name} (huggingface_hub's layout).
  std::string cache_folder() const { return "models--" + (owner.empty() ? name : owner + "--" + name); }
};

// huggingface_hub's validate_repo_id: one or two parts of letters, digits, '_', '-', '.', each
// starting and ending with a letter, digit or '_', no "--" or "..", at most 96 characters.
// nullopt for anything else (an absolute or relative path with more parts, "./x", "a/b/c").
std::optional<RepoId> parse_repo_id(const std::string& text);

}  // namespace m3::hub
