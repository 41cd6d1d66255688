// The download against tests/hub/mock_hub.py on 127.0.0.1 (never a remote host): the cache it
// leaves (huggingface_hub's layout), the files it skips, a transfer that breaks and resumes with
// an HTTP Range (in the same run and in the next), a hash mismatch, a gated repo and HF_TOKEN, a
// missing repo or revision, the Hub unreachable, redirects to another host, and HTTPS with
// certificate verification.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <random>

#include "core/error.h"
#include "hub/hub_cache.h"
#include "hub/sha256.h"
#include "hub/snapshot.h"
#include "tests/hub/mock_hub.h"

namespace m3::hub {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write(const fs::path& path, const std::string& data) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

std::string sha256(const std::string& data) {
  Sha256 h;
  h.update(data.data(), data.size());
  return h.hex_digest();
}

// A repository of two weight shards (LFS on the mock) with their index, a config and a tokenizer.
struct Fixture {
  test::TempDir dir;
  fs::path repo_dir = dir.path() / "repo";
  fs::path cache = dir.path() / "cache";
  fs::path log = dir.path() / "requests.log";
  std::string shard1, shard2;

  Fixture() {
    std::mt19937 rng(7);
    auto bytes = [&](size_t n) {
      std::string s(n, '\0');
      for (char& c : s) c = static_cast<char>(rng());
      return s;
    };
    shard1 = bytes(3 << 20);
    shard2 = bytes(1 << 20);
    write(repo_dir / "model-00001-of-00002.safetensors", shard1);
    write(repo_dir / "model-00002-of-00002.safetensors", shard2);
    write(repo_dir / "model.safetensors.index.json",
          R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
    write(repo_dir / "config.json", R"({"model_type": "minimax_m3"})");
    write(repo_dir / "tokenizer.json", "{}");
  }
  std::vector<std::string> args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {"--repo", "org/tiny=" + repo_dir.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  HubSettings settings(const test::MockHub& hub, const std::string& scheme = "http") const {
    HubSettings s;
    s.endpoint = hub.endpoint(scheme);
    s.cache = cache;
    return s;
  }
  HubCache hub_cache() const { return HubCache(cache, RepoId{"org", "tiny"}); }
};

const RepoId kRepo{"org", "tiny"};

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(HubDownload, FillsTheCacheAsHuggingfaceHubAndFetchesOnlyWhatM3serveReads) {
  Fixture f;
  test::MockHub hub(f.log, f.args({"--extra-files"}));
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub));
  const std::string commit = snapshot.filename().string();
  EXPECT_EQ(f.hub_cache().commit_for("main"), commit);
  EXPECT_EQ(snapshot, f.hub_cache().snapshot(commit));
  EXPECT_EQ(slurp(snapshot / "model-00001-of-00002.safetensors"), f.shard1);
  EXPECT_EQ(slurp(snapshot / "model-00002-of-00002.safetensors"), f.shard2);
  // Blobs by sha256 (LFS) and by git blob id (the others), linked relatively.
  EXPECT_TRUE(fs::is_regular_file(f.hub_cache().blob(sha256(f.shard1))));
  EXPECT_EQ(fs::read_symlink(snapshot / "model-00001-of-00002.safetensors"), "../../blobs/" + sha256(f.shard1));
  EXPECT_TRUE(fs::is_symlink(snapshot / "config.json"));
  for (const char* name : {"pytorch_model.bin", "model.gguf", "images/logo.png", "original/consolidated.safetensors",
                           "README.md"}) {
    EXPECT_TRUE(hub.requests_for(name).empty()) << name << " was fetched";
    EXPECT_FALSE(fs::exists(snapshot / name)) << name;
  }
  for (const auto& entry : fs::directory_iterator(f.hub_cache().repo_folder() / "blobs")) {
    EXPECT_NE(entry.path().extension(), ".incomplete") << entry.path();
  }
  // Again: the listing only, no file.
  const size_t before = hub.requests().size();
  EXPECT_EQ(fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub)), snapshot);
  ASSERT_EQ(hub.requests().size(), before + 1);
  EXPECT_NE(hub.requests().back()["path"].get<std::string>().find("/api/models/org/tiny/revision/main"),
            std::string::npos);
  // By tag and by commit hash: the same snapshot, no file fetched again.
  EXPECT_EQ(fetch_snapshot({kRepo, "v1", FileSet::kModel}, f.settings(hub)), snapshot);
  EXPECT_EQ(fetch_snapshot({kRepo, commit, FileSet::kModel}, f.settings(hub)), snapshot);
  EXPECT_EQ(hub.requests_for("/resolve/").size(), 5u);  // 2 shards, index, config, tokenizer: once each
  // Offline, the cache answers.
  HubSettings offline = f.settings(hub);
  offline.offline = true;
  offline.endpoint = "http://127.0.0.1:1";
  EXPECT_EQ(fetch_snapshot({kRepo, "v1", FileSet::kModel}, offline), snapshot);
}

TEST(HubDownload, ATokenizerOnlyFetchesTheTokenizerFiles) {
  Fixture f;
  test::MockHub hub(f.log, f.args());
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kTokenizer}, f.settings(hub));
  EXPECT_TRUE(fs::exists(snapshot / "tokenizer.json"));
  EXPECT_TRUE(hub.requests_for(".safetensors").empty());
  EXPECT_TRUE(hub.requests_for("config.json").empty());
}

TEST(HubDownload, ABrokenTransferResumesWithARange) {
  Fixture f;
  test::MockHub hub(f.log, f.args({"--drop-once", "model-00001-of-00002.safetensors"}));
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub));
  EXPECT_EQ(slurp(snapshot / "model-00001-of-00002.safetensors"), f.shard1);
  const auto shard = hub.requests_for("model-00001-of-00002.safetensors");
  ASSERT_EQ(shard.size(), 2u);
  EXPECT_TRUE(shard[0]["range"].is_null());
  // The mock sent half the file before it hung up; the second request asks for the rest.
  EXPECT_EQ(shard[1]["range"], fmt::format("bytes={}-", f.shard1.size() / 2));
}

TEST(HubDownload, APartialFileIsKeptAndTheNextRunResumesIt) {
  Fixture f;
  {
    test::MockHub hub(f.log, f.args({"--drop-always", "model-00001-of-00002.safetensors"}));
    expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub)); },
                 {"model-00001-of-00002.safetensors", "/org/tiny/resolve/main/model-00001-of-00002.safetensors",
                  "failed after 5 attempts", ".incomplete", "the next run resumes"});
  }
  const fs::path partial = f.hub_cache().blob(sha256(f.shard1)).string() + ".incomplete";
  ASSERT_TRUE(fs::exists(partial));
  const size_t kept = fs::file_size(partial);
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, f.shard1.size());
  fs::remove(f.log);
  test::MockHub hub(f.log, f.args());
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub));
  EXPECT_EQ(slurp(snapshot / "model-00001-of-00002.safetensors"), f.shard1);
  const auto shard = hub.requests_for("model-00001-of-00002.safetensors");
  ASSERT_EQ(shard.size(), 1u);
  EXPECT_EQ(shard[0]["range"], fmt::format("bytes={}-", kept));
  EXPECT_FALSE(fs::exists(partial));
}

TEST(HubDownload, AHashMismatchNamesTheFileAndRemovesIt) {
  Fixture f;
  test::MockHub hub(f.log, f.args({"--bad-sha256", "model-00002-of-00002.safetensors"}));
  expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub)); },
               {"'model-00002-of-00002.safetensors' of org/tiny: sha256 mismatch", sha256(f.shard2),
                "the bad download was removed"});
  for (const auto& entry : fs::directory_iterator(f.hub_cache().repo_folder() / "blobs")) {
    EXPECT_EQ(entry.path().string().find(sha256("something else")), std::string::npos) << entry.path();
  }
  // config.json comes last, so the broken snapshot has none: offline it is not taken for whole.
  const std::string commit = *f.hub_cache().commit_for("main");
  EXPECT_FALSE(fs::exists(f.hub_cache().snapshot(commit) / "config.json"));
}

TEST(HubDownload, AGatedRepoAsksForHFTokenAndTheTokenOpensIt) {
  Fixture f;
  test::MockHub hub(f.log, f.args({"--gated", "org/tiny", "--token", "hf_secret", "--redirect"}));
  expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub)); },
               {"access to org/tiny at revision 'main' refused (HTTP 401", "HF_TOKEN"});
  HubSettings wrong = f.settings(hub);
  wrong.token = "hf_wrong";
  wrong.token_origin = "HF_TOKEN";
  expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, wrong); },
               {"HTTP 401", "the token from HF_TOKEN was sent and has no access"});
  HubSettings right = f.settings(hub);
  right.token = "hf_secret";
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, right);
  EXPECT_EQ(slurp(snapshot / "model-00002-of-00002.safetensors"), f.shard2);
  // The token goes to the Hub's host, not to the host a file is redirected to.
  for (const auto& r : hub.requests_for("/resolve/")) EXPECT_EQ(r["authorization"], "Bearer hf_secret");
  const auto cdn = hub.requests_for("/cdn/");
  ASSERT_EQ(cdn.size(), 5u);
  for (const auto& r : cdn) EXPECT_TRUE(r["authorization"].is_null()) << r.dump();
}

TEST(HubDownload, MissingRepoRevisionAndUnreachableHub) {
  Fixture f;
  test::MockHub hub(f.log, f.args());
  expect_error([&] { fetch_snapshot({RepoId{"org", "nope"}, "main", FileSet::kModel}, f.settings(hub)); },
               {"Hugging Face repo 'org/nope' not found (HTTP 404", "/api/models/org/nope/revision/main",
                "not a local directory"});
  expect_error([&] { fetch_snapshot({kRepo, "dev", FileSet::kModel}, f.settings(hub)); },
               {"no revision 'dev' in org/tiny", "branch, a tag or a commit hash"});
  HubSettings down = f.settings(hub);
  down.endpoint = "http://127.0.0.1:1";
  expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, down); },
               {"org/tiny at revision 'main' is not in the Hugging Face cache", "cannot be reached",
                "http://127.0.0.1:1/api/models/org/tiny/revision/main", "cannot connect"});
  // Once cached, an unreachable Hub falls back to the cache.
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub));
  EXPECT_EQ(fetch_snapshot({kRepo, "main", FileSet::kModel}, down), snapshot);
}

// HTTPS for real: a certificate the system store does not hold is refused; trusted through
// SSL_CERT_FILE (OpenSSL's override of the default store), the same server is used.
TEST(HubDownload, HttpsVerifiesTheServerCertificate) {
  Fixture f;
  const fs::path cert = f.dir.path() / "cert.pem";
  const fs::path key = f.dir.path() / "key.pem";
  const std::string make_cert = fmt::format(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -addext "
      "subjectAltName=IP:127.0.0.1,DNS:localhost -keyout {} -out {} >/dev/null 2>&1",
      key.string(), cert.string());
  ASSERT_EQ(std::system(make_cert.c_str()), 0) << make_cert;
  test::MockHub hub(f.log, f.args({"--tls-cert", cert.string(), "--tls-key", key.string(), "--redirect"}));
  expect_error([&] { fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub, "https")); },
               {"TLS handshake failed", "certificate verify failed", "system store"});
  const char* before = std::getenv("SSL_CERT_FILE");
  const std::string saved = before ? before : "";
  ::setenv("SSL_CERT_FILE", cert.c_str(), 1);
  const fs::path snapshot = fetch_snapshot({kRepo, "main", FileSet::kModel}, f.settings(hub, "https"));
  if (saved.empty()) ::unsetenv("SSL_CERT_FILE"); else ::setenv("SSL_CERT_FILE", saved.c_str(), 1);
  EXPECT_EQ(slurp(snapshot / "model-00001-of-00002.safetensors"), f.shard1);
  EXPECT_EQ(hub.requests_for("/cdn/").size(), 5u);  // redirected to https://localhost: its name checked too
}

}  // namespace
}  // namespace m3::hub
