#include "hub/snapshot.h"

#include <algorithm>
#include <numeric>

#include "core/log.h"
#include "hub/blob_download.h"
#include "hub/hub_api.h"
#include "hub/hub_cache.h"

namespace m3::hub {
namespace {

namespace fs = std::filesystem;

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The cached snapshot of the revision when it holds every file `set` needs, else empty.
fs::path cached_snapshot(const HubCache& cache, const SnapshotRequest& r, std::vector<std::string>* missing) {
  const std::optional<std::string> commit = cache.commit_for(r.revision);
  if (!commit) return {};
  const fs::path snapshot = cache.snapshot(*commit);
  std::vector<std::string> lacks = missing_files(snapshot, r.files);
  if (lacks.empty()) return snapshot;
  if (missing) *missing = std::move(lacks);
  return {};
}

fs::path offline_snapshot(const HubCache& cache, const SnapshotRequest& r) {
  std::vector<std::string> missing;
  const fs::path snapshot = cached_snapshot(cache, r, &missing);
  if (!snapshot.empty()) return snapshot;
  if (missing.empty()) {
    fail("HF_HUB_OFFLINE is set and {} at revision '{}' is not in the Hugging Face cache {} (no {}); unset "
         "HF_HUB_OFFLINE to download it, or point HF_HUB_CACHE / --download-dir at a cache that holds it",
         r.repo.str(), r.revision, cache.root().string(),
         (cache.repo_folder() / "refs" / r.revision).string());
  }
  fail("HF_HUB_OFFLINE is set and the Hugging Face cache {} holds only part of {} at revision '{}' (missing: {}); "
       "unset HF_HUB_OFFLINE to download the rest",
       cache.root().string(), r.repo.str(), r.revision, joined(missing));
}

}  // namespace

fs::path fetch_snapshot(const SnapshotRequest& r, const HubSettings& settings) {
  const HubCache cache(settings.cache, r.repo);
  if (settings.offline) return offline_snapshot(cache, r);

  HttpClient client;
  const HubRequest request{settings, r.repo, r.revision};
  RevisionInfo info;
  try {
    info = fetch_revision_info(client, request);
  } catch (const NetworkError& e) {
    const fs::path cached = cached_snapshot(cache, r, nullptr);
    if (cached.empty()) {
      fail("{} at revision '{}' is not in the Hugging Face cache {} and the Hub cannot be reached: {} (HF_ENDPOINT "
           "selects another endpoint)",
           r.repo.str(), r.revision, cache.root().string(), e.what());
    }
    M3_LOG_WARN("the Hub cannot be reached ({}); using the cached snapshot {}", e.what(), cached.string());
    return cached;
  }
  M3_CHECK(is_commit_hash(info.commit), "{}: the Hub's listing of {} at revision '{}' names commit '{}', not a hash",
           settings.endpoint, r.repo.str(), r.revision, info.commit);
  cache.write_ref(r.revision, info.commit);

  std::vector<RepoFile> wanted;
  for (const RepoFile& f : info.files) {
    if (is_needed(f.path, r.files)) wanted.push_back(f);
  }
  if (r.files == FileSet::kModel) {
    const auto has = [&](auto predicate) { return std::any_of(wanted.begin(), wanted.end(), predicate); };
    std::string listed;
    for (const RepoFile& f : info.files) listed += (listed.empty() ? "" : ", ") + f.path;
    M3_CHECK(has([](const RepoFile& f) { return f.path == "config.json"; }),
             "{} at revision '{}' has no config.json at its top (its files: {})", r.repo.str(), r.revision, listed);
    M3_CHECK(has([](const RepoFile& f) { return f.path.ends_with(".safetensors"); }),
             "{} at revision '{}' has no .safetensors weights at its top, and m3serve reads safetensors only (its "
             "files: {})",
             r.repo.str(), r.revision, listed);
  }

  const fs::path snapshot = cache.snapshot(info.commit);
  std::vector<RepoFile> to_link;
  std::vector<RepoFile> to_fetch;
  for (const RepoFile& f : wanted) {
    if (fs::exists(snapshot / f.path)) continue;  // linked and its blob there (exists follows the link)
    const fs::path blob = cache.blob(f.blob_name());
    const bool have_blob = fs::exists(blob) && static_cast<int64_t>(fs::file_size(blob)) == f.size;
    (have_blob ? to_link : to_fetch).push_back(f);
  }
  if (!to_fetch.empty()) {
    const int64_t bytes = std::accumulate(to_fetch.begin(), to_fetch.end(), int64_t{0},
                                          [](int64_t sum, const RepoFile& f) { return sum + f.size; });
    M3_LOG_INFO("downloading {} at revision '{}' (commit {}): {} file{}, {:.1f} MiB from {} into {}", r.repo.str(),
                r.revision, info.commit, to_fetch.size(), to_fetch.size() == 1 ? "" : "s", bytes / (1024.0 * 1024.0),
                settings.endpoint, cache.repo_folder().string());
    DownloadProgress progress(settings.progress_bar, r.repo.str(), bytes, static_cast<int>(to_fetch.size()));
    const BlobDownload download{client, request, cache, progress};
    // config.json last: a snapshot with a config.json is one whose weights are all in.
    std::stable_partition(to_fetch.begin(), to_fetch.end(), [](const RepoFile& f) { return f.path != "config.json"; });
    for (const RepoFile& f : to_fetch) {
      download_blob(download, f);
      cache.link_into_snapshot(info.commit, f.path, f.blob_name());
    }
  }
  for (const RepoFile& f : to_link) cache.link_into_snapshot(info.commit, f.path, f.blob_name());
  return snapshot;
}

}  // namespace m3::hub
