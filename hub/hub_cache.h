// The Hugging Face cache as huggingface_hub lays it out, so `huggingface-cli` and m3serve share it:
//   <cache>/models--{owner}--{name}/refs/{revision}     the commit a branch or tag points at
//                                  /snapshots/{commit}/{path}  relative symlinks into blobs/
//                                  /blobs/{sha256 of LFS files, git blob id of the others}
//   <cache>/.locks/models--{owner}--{name}/{blob}.lock  held while a blob is written
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include "hub/repo_id.h"

namespace m3::hub {

// A 40-digit lowercase hex string: a revision that is a commit hash.
bool is_commit_hash(const std::string& revision);

class HubCache {
 public:
  HubCache(std::filesystem::path root, RepoId repo) : root_(std::move(root)), repo_(std::move(repo)) {}

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path repo_folder() const { return root_ / repo_.cache_folder(); }
  std::filesystem::path snapshot(const std::string& commit) const { return repo_folder() / "snapshots" / commit; }
  std::filesystem::path blob(const std::string& blob_name) const { return repo_folder() / "blobs" / blob_name; }
  std::filesystem::path lock_file(const std::string& blob_name) const {
    return root_ / ".locks" / repo_.cache_folder() / (blob_name + ".lock");
  }

  // The commit a revision names here: refs/{revision}'s content, or the revision itself when it
  // is a commit hash with a snapshot folder. nullopt when the cache does not know it.
  std::optional<std::string> commit_for(const std::string& revision) const;
  // refs/{revision} = commit (not for a revision that is the commit itself, as huggingface_hub).
  void write_ref(const std::string& revision, const std::string& commit) const;
  // snapshots/{commit}/{path} -> ../(..)/blobs/{blob_name}, replacing what was there.
  void link_into_snapshot(const std::string& commit, const std::string& path, const std::string& blob_name) const;

 private:
  std::filesystem::path root_;
  RepoId repo_;
};

}  // namespace m3::hub
