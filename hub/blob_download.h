// One file of a repository into the cache's blobs/: written to blobs/{blob}.incomplete (kept
// when the transfer breaks, so the next attempt, or the next run, asks for the rest with an HTTP
// Range), checked for its size and, for LFS files, its sha256, then renamed to blobs/{blob}. A
// file that fails its check is removed. The blob's lock file (huggingface_hub's) is held
// throughout, so another m3serve or huggingface-cli writing the same blob waits.
#pragma once
#include <filesystem>

#include "hub/download_progress.h"
#include "hub/hub_api.h"
#include "hub/hub_cache.h"

namespace m3::hub {

struct BlobDownload {
  HttpClient& client;
  const HubRequest& request;
  const HubCache& cache;
  DownloadProgress& progress;
  int attempts = 5;  // transfers that break are resumed this many times in all
};

// Leaves cache.blob(file.blob_name()) complete and checked. Throws m3::Error naming the file (and
// the URL) when it cannot.
void download_blob(const BlobDownload& download, const RepoFile& file);

}  // namespace m3::hub
