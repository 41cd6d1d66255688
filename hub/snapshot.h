// A repository revision as a local folder: its snapshot in the Hugging Face cache, with the files
// m3serve reads (hub/needed_files.h) downloaded first when they are missing.
//
// Online, the revision's listing is asked for (one request, as huggingface_hub's snapshot_download
// does, so a branch that moved is followed), refs/{revision} updated, and only the files the
// snapshot lacks are fetched. When the Hub cannot be reached and the cache already holds the
// revision's files, the cached snapshot is used with a warning. Offline (HF_HUB_OFFLINE) the cache
// alone answers, and a revision it lacks is an error naming the repo, the revision and the cache.
#pragma once
#include <filesystem>
#include <string>

#include "hub/hub_settings.h"
#include "hub/needed_files.h"
#include "hub/repo_id.h"

namespace m3::hub {

struct SnapshotRequest {
  RepoId repo;
  std::string revision = "main";  // a branch, a tag or a commit hash
  FileSet files = FileSet::kModel;
};

std::filesystem::path fetch_snapshot(const SnapshotRequest& request, const HubSettings& settings);

}  // namespace m3::hub
