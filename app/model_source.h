// A model (or tokenizer) as the user names it, wherever a model directory is accepted (serve's
// MODEL, --model, --tokenizer, plan's MODEL): a local directory, or a Hugging Face repo id
// ("org/name") resolved through hub/ to its snapshot in the Hugging Face cache (HF_HUB_CACHE,
// HF_HOME, --download-dir), downloaded first when the cache lacks it (HF_ENDPOINT, HF_TOKEN,
// HF_HUB_OFFLINE; docs/architecture.md "Hugging Face repo ids").
#pragma once
#include <optional>
#include <string>

#include "hub/needed_files.h"

namespace CLI {
class App;
}

namespace m3::app {

struct ModelOptions;

// Where a repo id's files come from: --revision, --download-dir.
struct HubOptions {
  std::optional<std::string> revision;  // a branch, a tag or a commit hash; unset: main
  std::string download_dir;             // the cache folder instead of HF_HUB_CACHE / $HF_HOME/hub
};

void add_hub_options(CLI::App& cmd, HubOptions& options);

// The local directory `given` names: itself when it is a directory, else the snapshot of the repo
// id it is (downloaded when missing). `option` names the option in errors and logs. Throws
// m3::Error for a path that is neither a directory nor a repo id, and for the Hub's failures.
std::string locate_model_dir(const std::string& given, const HubOptions& hub, hub::FileSet files,
                             const std::string& option);

// options.model_dir -> the local directory it names (the loader's options then name files), after
// check_model_options (so a bad option fails before any download).
void locate_model(ModelOptions& options);

}  // namespace m3::app
