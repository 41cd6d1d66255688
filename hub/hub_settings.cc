#include "hub/hub_settings.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace m3::hub {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// huggingface_hub's _is_true.
bool env_true(const char* name) {
  std::string value = env(name);
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
  return value == "1" || value == "true" || value == "yes" || value == "on";
}

std::string trimmed(std::string text) {
  const auto space = [](unsigned char c) { return std::isspace(c); };
  text.erase(text.begin(), std::find_if_not(text.begin(), text.end(), space));
  text.erase(std::find_if_not(text.rbegin(), text.rend(), space).base(), text.end());
  return text;
}

}  // namespace

HubSettings HubSettings::from_environment(const std::string& download_dir) {
  HubSettings s;
  if (std::string endpoint = env("HF_ENDPOINT"); !endpoint.empty()) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    s.endpoint = endpoint;
  }
  std::filesystem::path home = env("HF_HOME");
  if (home.empty()) {
    const std::string xdg = env("XDG_CACHE_HOME");
    home = xdg.empty() ? std::filesystem::path(env("HOME")) / ".cache" / "huggingface"
                       : std::filesystem::path(xdg) / "huggingface";
  }
  if (!download_dir.empty()) {
    s.cache = download_dir;
  } else if (const std::string hub_cache = env("HF_HUB_CACHE"); !hub_cache.empty()) {
    s.cache = hub_cache;
  } else if (const std::string legacy = env("HUGGINGFACE_HUB_CACHE"); !legacy.empty()) {
    s.cache = legacy;
  } else {
    s.cache = home / "hub";
  }
  s.token = trimmed(env("HF_TOKEN"));
  s.token_origin = "HF_TOKEN";
  if (s.token.empty()) {
    const std::string path_env = env("HF_TOKEN_PATH");
    const std::filesystem::path token_file = path_env.empty() ? home / "token" : std::filesystem::path(path_env);
    std::ifstream in(token_file);
    std::string line;
    if (in && std::getline(in, line)) {
      s.token = trimmed(line);
      s.token_origin = token_file.string();
    }
  }
  s.offline = env_true("HF_HUB_OFFLINE");
  s.progress_bar = ::isatty(STDERR_FILENO) == 1;
  return s;
}

}  // namespace m3::hub
