// The Hub's HTTP interface as m3serve uses it: the revision listing
// GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true (commit, files with sizes, git
// blob ids and LFS sha256), file URLs {endpoint}/{repo}/resolve/{revision}/{path}, the token
// header, and what each error status means for the user.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hub/http_client.h"
#include "hub/hub_settings.h"
#include "hub/repo_id.h"

namespace m3::hub {

struct RepoFile {
  std::string path;                        // in the repository, '/'-separated
  int64_t size = 0;                        // bytes of the file itself (LFS: the object's size)
  std::string git_blob_id;                 // git's hash of the stored blob (the pointer, for LFS)
  std::optional<std::string> lfs_sha256;   // LFS files: the object's sha256

  // Its name under blobs/ (huggingface_hub's: the etag, which is the sha256 of an LFS object
  // and the git blob id of any other file).
  const std::string& blob_name() const { return lfs_sha256 ? *lfs_sha256 : git_blob_id; }
};

struct RevisionInfo {
  std::string commit;  // the 40-digit hash the revision points at
  std::vector<RepoFile> files;
};

// What a request was for, for the messages of its errors.
struct HubRequest {
  const HubSettings& settings;
  const RepoId& repo;
  const std::string& revision;
};

// Headers every Hub request sends (Authorization: Bearer {token} to the Hub's own host only).
HttpGetOptions hub_get_options(const HubSettings& settings);

std::string file_url(const HubRequest& request, const std::string& path);

// Throws m3::Error for a response that is not 2xx: not found (repo or revision, from the Hub's
// X-Error-Code), gated or private (401/403: HF_TOKEN), other statuses with the URL. `what` names
// the file for a file request, empty for the listing.
void check_status(const HttpResponse& response, const HubRequest& request, const std::string& what);

// The listing. Throws NetworkError when the Hub cannot be reached, m3::Error for an error status
// or a body that is not the listing.
RevisionInfo fetch_revision_info(HttpClient& client, const HubRequest& request);

// Parses the listing's JSON; `url` names it in errors.
RevisionInfo parse_revision_info(const std::string& json, const std::string& url);

}  // namespace m3::hub
