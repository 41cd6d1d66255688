#include "app/model_source.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "app/model_loader.h"
#include "core/error.h"
#include "core/log.h"
#include "hub/repo_id.h"
#include "hub/snapshot.h"

namespace m3::app {

void add_hub_options(CLI::App& cmd, HubOptions& o) {
  cmd.add_option("--revision", o.revision,
                 "with a Hugging Face repo id: the branch, tag or commit hash to use (default main)");
  cmd.add_option("--download-dir", o.download_dir,
                 "with a Hugging Face repo id: the cache folder to find and download it in (default HF_HUB_CACHE, "
                 "else $HF_HOME/hub, else ~/.cache/huggingface/hub)");
}

std::string locate_model_dir(const std::string& given, const HubOptions& hub, hub::FileSet files,
                             const std::string& option) {
  namespace fs = std::filesystem;
  if (fs::is_directory(given)) {
    if (hub.revision) {
      M3_LOG_WARN("revision {}: {} '{}' is a local directory, read as it is (a revision applies to Hugging Face "
                  "repo ids)",
                  *hub.revision, option, given);
    }
    return given;
  }
  M3_CHECK(!fs::exists(given), "{} '{}' is a file; expected a model directory or a Hugging Face repo id (org/name)",
           option, given);
  const std::optional<hub::RepoId> repo = hub::parse_repo_id(given);
  M3_CHECK(repo.has_value(),
           "{} '{}' is neither a directory nor a valid Hugging Face repo id (org/name: letters, digits, '-', '_', '.')",
           option, given);
  const hub::SnapshotRequest request{*repo, hub.revision.value_or("main"), files};
  const std::string dir = hub::fetch_snapshot(request, hub::HubSettings::from_environment(hub.download_dir)).string();
  M3_LOG_INFO("{} {} (revision {}): {}", option, given, request.revision, dir);
  return dir;
}

void locate_model(ModelOptions& o) {
  check_model_options(o);  // a bad option fails before a download, which may be long
  o.model_dir = locate_model_dir(o.model_dir, o.hub, hub::FileSet::kModel, "--model");
}

}  // namespace m3::app
