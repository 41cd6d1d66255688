#include "hub/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <system_error>

#include "core/error.h"

namespace m3::hub {

namespace fs = std::filesystem;

bool is_commit_hash(const std::string& revision) {
  return revision.size() == 40 && std::all_of(revision.begin(), revision.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::optional<std::string> HubCache::commit_for(const std::string& revision) const {
  std::ifstream ref(repo_folder() / "refs" / revision);
  std::string commit;
  if (ref && std::getline(ref, commit)) {
    while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back()))) commit.pop_back();
    if (is_commit_hash(commit)) return commit;
  }
  if (is_commit_hash(revision) && fs::is_directory(snapshot(revision))) return revision;
  return std::nullopt;
}

void HubCache::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  const fs::path ref = repo_folder() / "refs" / revision;
  std::error_code ec;
  fs::create_directories(ref.parent_path(), ec);
  M3_CHECK(!ec, "Hugging Face cache: cannot create {} ({})", ref.parent_path().string(), ec.message());
  // Written aside and renamed, so a reader never sees half a hash.
  const fs::path temporary = ref.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << commit;
    M3_CHECK(out.good(), "Hugging Face cache: cannot write {}", temporary.string());
  }
  fs::rename(temporary, ref, ec);
  M3_CHECK(!ec, "Hugging Face cache: cannot write {} ({})", ref.string(), ec.message());
}

void HubCache::link_into_snapshot(const std::string& commit, const std::string& path,
                                  const std::string& blob_name) const {
  const fs::path link = snapshot(commit) / path;
  std::error_code ec;
  fs::create_directories(link.parent_path(), ec);
  M3_CHECK(!ec, "Hugging Face cache: cannot create {} ({})", link.parent_path().string(), ec.message());
  // Relative, as huggingface_hub makes them: the cache can move as a whole.
  const fs::path target = fs::relative(blob(blob_name), link.parent_path(), ec);
  M3_CHECK(!ec, "Hugging Face cache: no relative path from {} to its blob ({})", link.string(), ec.message());
  fs::remove(link, ec);
  fs::create_symlink(target, link, ec);
  // Another process (a second node on this host, huggingface-cli) may have made the same link.
  if (ec == std::errc::file_exists && fs::read_symlink(link) == target) return;
  M3_CHECK(!ec, "Hugging Face cache: cannot link {} to {} ({})", link.string(), target.string(), ec.message());
}

}  // namespace m3::hub
