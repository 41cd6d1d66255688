// Where the Hub is and how to reach it, from huggingface_hub's environment variables (read once by
// from_environment; everything below takes the settings as a value).
#pragma once
#include <filesystem>
#include <string>

namespace m3::hub {

struct HubSettings {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT, no trailing '/'
  std::filesystem::path cache;                      // the folder holding models--{owner}--{name}
  std::string token;                                // empty: anonymous
  std::string token_origin;                         // "HF_TOKEN" or the token file's path (for errors)
  bool offline = false;                             // HF_HUB_OFFLINE
  bool progress_bar = false;                        // stderr is a terminal

  // download_dir (--download-dir) is the cache when given, as vLLM passes it to huggingface_hub;
  // else HF_HUB_CACHE, else $HF_HOME/hub, HF_HOME defaulting to $XDG_CACHE_HOME/huggingface or
  // ~/.cache/huggingface. The token: HF_TOKEN, else the file `huggingface-cli login` writes
  // (HF_TOKEN_PATH, default $HF_HOME/token). HF_HUB_OFFLINE: 1, true, yes or on.
  static HubSettings from_environment(const std::string& download_dir);
};

}  // namespace m3::hub
