#include "hub/hub_api.h"

#include <cctype>
#include <nlohmann/json.hpp>

namespace m3::hub {
namespace {

// Percent-encodes a URL path segment (a revision such as refs/pr/1 is one segment).
std::string encode_segment(const std::string& text, bool keep_slashes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slashes && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string revision_text(const HubRequest& r) { return fmt::format("{} at revision '{}'", r.repo.str(), r.revision); }

}  // namespace

HttpGetOptions hub_get_options(const HubSettings& settings) {
  HttpGetOptions options;
  if (!settings.token.empty()) options.same_host_headers.push_back({"Authorization", "Bearer " + settings.token});
  return options;
}

std::string file_url(const HubRequest& r, const std::string& path) {
  return fmt::format("{}/{}/resolve/{}/{}", r.settings.endpoint, r.repo.str(), encode_segment(r.revision, false),
                     encode_segment(path, true));
}

void check_status(const HttpResponse& response, const HubRequest& r, const std::string& what) {
  if (response.status >= 200 && response.status < 300) return;
  const std::string subject = what.empty() ? revision_text(r) : fmt::format("{} of {}", what, revision_text(r));
  const std::string code = response.header("X-Error-Code").value_or("");
  const std::string detail = response.header("X-Error-Message").value_or("");
  const std::string hub_says = detail.empty() ? "" : fmt::format(" (the Hub says: {})", detail);
  const std::string token_hint =
      r.settings.token.empty()
          ? "if the repo is gated or private, accept its terms on the Hub and set HF_TOKEN to an access token"
          : fmt::format("the token from {} was sent and has no access; check it can read this repo",
                        r.settings.token_origin);
  // The Hub answers 401 with RepoNotFound for a repo it does not show an anonymous client (missing,
  // or private), so the error code decides before the status.
  if (code == "RepoNotFound" || (response.status == 404 && code.empty())) {
    fail("Hugging Face repo '{}' not found (HTTP {} from {}){}; it is not a local directory either ({})",
         r.repo.str(), response.status, response.url, hub_says, token_hint);
  }
  if (code == "RevisionNotFound") {
    fail("{}: no revision '{}' in {} (HTTP {} from {}); --revision takes a branch, a tag or a commit hash",
         r.repo.str(), r.revision, r.repo.str(), response.status, response.url);
  }
  if (code == "EntryNotFound") fail("{}: not found (HTTP {} from {})", subject, response.status, response.url);
  if (code == "GatedRepo" || response.status == 401 || response.status == 403) {
    fail("access to {} refused (HTTP {} from {}){}: {}", subject, response.status, response.url, hub_says,
         token_hint);
  }
  const std::string body = response.error_body.substr(0, 300);
  fail("{}: HTTP {} from {}{}{}", subject, response.status, response.url, hub_says,
       body.empty() ? "" : ": " + body);
}

RevisionInfo fetch_revision_info(HttpClient& client, const HubRequest& r) {
  const std::string url = fmt::format("{}/api/models/{}/revision/{}?blobs=true", r.settings.endpoint, r.repo.str(),
                                      encode_segment(r.revision, false));
  std::string body;
  const HttpResponse response = client.get(url, hub_get_options(r.settings), {},
                                           [&](const char* data, std::size_t size) { body.append(data, size); });
  check_status(response, r, "");
  return parse_revision_info(body, url);
}

RevisionInfo parse_revision_info(const std::string& text, const std::string& url) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  M3_CHECK(!j.is_discarded() && j.is_object(), "{}: the answer is not a JSON object", url);
  RevisionInfo info;
  const auto sha = j.find("sha");
  M3_CHECK(sha != j.end() && sha->is_string(), "{}: the answer has no commit hash ('sha')", url);
  info.commit = sha->get<std::string>();
  const auto siblings = j.find("siblings");
  M3_CHECK(siblings != j.end() && siblings->is_array(), "{}: the answer has no file list ('siblings')", url);
  for (const nlohmann::json& s : *siblings) {
    RepoFile file;
    M3_CHECK(s.is_object() && s.contains("rfilename") && s["rfilename"].is_string(),
             "{}: a file without 'rfilename' in 'siblings'", url);
    file.path = s["rfilename"].get<std::string>();
    M3_CHECK(file.path.find("..") == std::string::npos && !file.path.empty() && file.path.front() != '/',
             "{}: file name '{}' leaves the repository", url, file.path);
    if (s.contains("blobId") && s["blobId"].is_string()) file.git_blob_id = s["blobId"].get<std::string>();
    if (s.contains("size") && s["size"].is_number_integer()) file.size = s["size"].get<int64_t>();
    if (s.contains("lfs") && s["lfs"].is_object()) {
      const nlohmann::json& lfs = s["lfs"];
      M3_CHECK(lfs.contains("sha256") && lfs["sha256"].is_string(), "{}: LFS file '{}' without a sha256", url,
               file.path);
      file.lfs_sha256 = lfs["sha256"].get<std::string>();
      if (lfs.contains("size") && lfs["size"].is_number_integer()) file.size = lfs["size"].get<int64_t>();
    }
    info.files.push_back(std::move(file));
  }
  return info;
}

}  // namespace m3::hub
