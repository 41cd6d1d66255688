// Repo ids and the cache huggingface_hub lays out, against fabricated caches (no network): refs,
// snapshots of symlinks into blobs, a revision by branch, by tag and by commit hash, offline
// errors, the files m3serve fetches, and the Hub's listing as parsed.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "hub/hub_api.h"
#include "hub/hub_cache.h"
#include "hub/needed_files.h"
#include "hub/repo_id.h"
#include "hub/snapshot.h"
#include "tests/hub/mock_hub.h"

namespace m3::hub {
namespace {

namespace fs = std::filesystem;

const std::string kMain = "0123456789abcdef0123456789abcdef01234567";
const std::string kOld = "89abcdef0123456789abcdef0123456789abcdef";

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// models--org--tiny: main -> kMain (config + index + two shards), v0 -> kOld (config only),
// every snapshot file a relative symlink into blobs/ as huggingface_hub makes them.
struct FabricatedCache {
  test::TempDir dir;
  RepoId repo{"org", "tiny"};
  HubCache cache{dir.path(), repo};

  void add(const std::string& commit, const std::string& path, const std::string& text) {
    const std::string blob_name = std::to_string(std::hash<std::string>{}(commit + path)) + "ab";
    write(cache.blob(blob_name), text);
    cache.link_into_snapshot(commit, path, blob_name);
  }
  FabricatedCache() {
    write(cache.repo_folder() / "refs" / "main", kMain);
    write(cache.repo_folder() / "refs" / "v0", kOld + "\n");
    add(kMain, "config.json", "{\"main\": 1}");
    add(kMain, "model.safetensors.index.json",
        R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
    add(kMain, "model-00001-of-00002.safetensors", "one");
    add(kMain, "model-00002-of-00002.safetensors", "two");
    add(kMain, "tokenizer.json", "{}");
    add(kOld, "config.json", "{\"old\": 1}");
  }
  HubSettings offline() const {
    HubSettings s;
    s.cache = dir.path();
    s.offline = true;
    return s;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(RepoId, AcceptsHubNamesAndRejectsPaths) {
  const auto id = parse_repo_id("MiniMaxAI/MiniMax-M3.1-Flash");
  ASSERT_TRUE(id);
  EXPECT_EQ(id->owner, "MiniMaxAI");
  EXPECT_EQ(id->name, "MiniMax-M3.1-Flash");
  EXPECT_EQ(id->cache_folder(), "models--MiniMaxAI--MiniMax-M3.1-Flash");
  ASSERT_TRUE(parse_repo_id("gpt2"));
  EXPECT_EQ(parse_repo_id("gpt2")->cache_folder(), "models--gpt2");
  for (const char* bad : {"", "/abs/path", "./rel", "a/b/c", "org/", "/name", "org/na--me", "org/..", "-org/x",
                          "org/x.", "org/x y", "models/minimax-m3-tiny/"}) {
    EXPECT_FALSE(parse_repo_id(bad)) << bad;
  }
  EXPECT_FALSE(parse_repo_id(std::string(97, 'a')));
}

TEST(HubCache, RevisionByBranchTagAndCommit) {
  FabricatedCache f;
  EXPECT_EQ(f.cache.commit_for("main"), kMain);
  EXPECT_EQ(f.cache.commit_for("v0"), kOld);  // trailing newline tolerated
  EXPECT_EQ(f.cache.commit_for(kOld), kOld);  // a commit hash with a snapshot
  EXPECT_FALSE(f.cache.commit_for("nope"));
  EXPECT_FALSE(f.cache.commit_for("fedcba9876543210fedcba9876543210fedcba98"));  // no such snapshot

  const fs::path main = fetch_snapshot({f.repo, "main", FileSet::kModel}, f.offline());
  EXPECT_EQ(main, f.cache.snapshot(kMain));
  EXPECT_EQ(slurp(main / "config.json"), "{\"main\": 1}");
  EXPECT_TRUE(fs::is_symlink(main / "config.json"));
  EXPECT_TRUE(fs::read_symlink(main / "config.json").is_relative());
  EXPECT_EQ(slurp(fetch_snapshot({f.repo, "v0", FileSet::kConfig}, f.offline()) / "config.json"), "{\"old\": 1}");
  EXPECT_EQ(fetch_snapshot({f.repo, kOld, FileSet::kConfig}, f.offline()), f.cache.snapshot(kOld));
  EXPECT_EQ(fetch_snapshot({f.repo, kMain, FileSet::kTokenizer}, f.offline()), main);
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(HubCache, OfflineFailsNamingRepoRevisionAndWhatIsMissing) {
  FabricatedCache f;
  expect_error([&] { fetch_snapshot({f.repo, "dev", FileSet::kModel}, f.offline()); },
               {"HF_HUB_OFFLINE", "org/tiny", "revision 'dev'", f.dir.path().string()});
  expect_error([&] { fetch_snapshot({RepoId{"org", "other"}, "main", FileSet::kModel}, f.offline()); },
               {"org/other", "'main'", "not in the Hugging Face cache"});
  // v0 has a config but no weights: fine for plan, not for a model.
  expect_error([&] { fetch_snapshot({f.repo, "v0", FileSet::kModel}, f.offline()); },
               {"holds only part of org/tiny", "'v0'", "*.safetensors"});
  // A shard whose blob is gone (a dangling link) is missing.
  fs::remove(fs::canonical(f.cache.snapshot(kMain) / "model-00002-of-00002.safetensors"));
  expect_error([&] { fetch_snapshot({f.repo, "main", FileSet::kModel}, f.offline()); },
               {"missing: model-00002-of-00002.safetensors"});
  EXPECT_EQ(fetch_snapshot({f.repo, "main", FileSet::kTokenizer}, f.offline()), f.cache.snapshot(kMain));
}

TEST(HubCache, WritesRefsAndRelativeLinksAsHuggingfaceHub) {
  test::TempDir dir;
  const HubCache cache(dir.path(), RepoId{"org", "m"});
  cache.write_ref("main", kMain);
  cache.write_ref(kMain, kMain);  // a commit names itself: no ref file
  EXPECT_EQ(slurp(cache.repo_folder() / "refs" / "main"), kMain);
  EXPECT_FALSE(fs::exists(cache.repo_folder() / "refs" / kMain));
  write(cache.blob("abc123"), "x");
  cache.link_into_snapshot(kMain, "sub/dir/file.json", "abc123");
  EXPECT_EQ(fs::read_symlink(cache.snapshot(kMain) / "sub/dir/file.json"), "../../../../blobs/abc123");
  EXPECT_EQ(slurp(cache.snapshot(kMain) / "sub/dir/file.json"), "x");
}

TEST(NeededFiles, ConfigTokenizerAndSafetensorsOnly) {
  for (const char* yes : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                          "chat_template.jinja", "special_tokens_map.json", "model.safetensors",
                          "model-00001-of-00163.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(is_needed(yes, FileSet::kModel)) << yes;
  }
  for (const char* no : {"pytorch_model.bin", "consolidated.pth", "model.gguf", "images/logo.png", "README.md",
                         "original/model.safetensors", ".gitattributes", "pytorch_model.bin.index.json"}) {
    EXPECT_FALSE(is_needed(no, FileSet::kModel)) << no;
  }
  EXPECT_TRUE(is_needed("tokenizer.json", FileSet::kTokenizer));
  EXPECT_FALSE(is_needed("model.safetensors", FileSet::kTokenizer));
  EXPECT_FALSE(is_needed("config.json", FileSet::kTokenizer));
  EXPECT_TRUE(is_needed("config.json", FileSet::kConfig));
  EXPECT_FALSE(is_needed("tokenizer.json", FileSet::kConfig));
}

TEST(Url, ParsesAndResolvesRedirects) {
  const Url url = Url::parse("https://huggingface.co/org/m/resolve/main/config.json?x=1");
  EXPECT_EQ(url.scheme, "https");
  EXPECT_EQ(url.host, "huggingface.co");
  EXPECT_EQ(url.port, "443");
  EXPECT_EQ(url.target, "/org/m/resolve/main/config.json?x=1");
  EXPECT_EQ(Url::parse("http://127.0.0.1:8080").target, "/");
  EXPECT_EQ(Url::parse("http://127.0.0.1:8080").port, "8080");
  EXPECT_EQ(url.resolve("/api/resolve-cache/a").str(), "https://huggingface.co/api/resolve-cache/a");
  EXPECT_EQ(url.resolve("https://cdn.example/x?sig=1").str(), "https://cdn.example/x?sig=1");
  EXPECT_EQ(url.resolve("//cdn.example/y").str(), "https://cdn.example/y");
  EXPECT_EQ(url.resolve("other.json").str(), "https://huggingface.co/org/m/resolve/main/other.json");
  expect_error([] { Url::parse("ftp://x/y"); }, {"only http and https"});
  expect_error([] { Url::parse("huggingface.co"); }, {"not a URL"});
  expect_error([] { Url::parse("http://host:12a/"); }, {"bad port"});
}

TEST(HubApi, StatusesBecomeErrorsThatSayWhatToDo) {
  HubSettings settings;
  const RepoId repo{"org", "m"};
  const std::string revision = "main";
  const HubRequest request{settings, repo, revision};
  const auto response = [](int status, const std::string& code) {
    HttpResponse r;
    r.status = status;
    r.url = "https://hub/x";
    if (!code.empty()) r.headers.push_back({"x-error-code", code});
    return r;
  };
  check_status(response(200, ""), request, "");
  check_status(response(206, ""), request, "file 'a'");
  // Anonymous clients get 401 RepoNotFound for a missing or private repo.
  expect_error([&] { check_status(response(401, "RepoNotFound"), request, ""); },
               {"Hugging Face repo 'org/m' not found (HTTP 401 from https://hub/x)", "HF_TOKEN"});
  expect_error([&] { check_status(response(404, ""), request, ""); }, {"'org/m' not found (HTTP 404"});
  expect_error([&] { check_status(response(403, "GatedRepo"), request, ""); },
               {"access to org/m at revision 'main' refused (HTTP 403", "gated", "HF_TOKEN"});
  expect_error([&] { check_status(response(404, "EntryNotFound"), request, "file 'a.json'"); },
               {"file 'a.json' of org/m at revision 'main': not found"});
  expect_error([&] { check_status(response(500, ""), request, "file 'a.json'"); }, {"HTTP 500 from https://hub/x"});
  settings.token = "t";
  settings.token_origin = "/home/u/.cache/huggingface/token";
  expect_error([&] { check_status(response(401, ""), request, ""); },
               {"the token from /home/u/.cache/huggingface/token was sent and has no access"});
}

TEST(HubApi, ParsesTheListing) {
  const RevisionInfo info = parse_revision_info(
      R"({"sha": "0123456789abcdef0123456789abcdef01234567", "siblings": [
          {"rfilename": "config.json", "size": 12, "blobId": "aa11"},
          {"rfilename": "model.safetensors", "size": 134, "blobId": "bb22",
           "lfs": {"sha256": "cc33", "size": 99, "pointerSize": 134}}]})",
      "http://hub/api");
  EXPECT_EQ(info.commit, kMain);
  ASSERT_EQ(info.files.size(), 2u);
  EXPECT_EQ(info.files[0].blob_name(), "aa11");
  EXPECT_EQ(info.files[0].size, 12);
  EXPECT_EQ(info.files[1].blob_name(), "cc33");  // an LFS file's blob is named by its sha256
  EXPECT_EQ(info.files[1].size, 99);              // the object's size, not the pointer's
  expect_error([] { parse_revision_info("[]", "http://hub/api"); }, {"http://hub/api", "not a JSON object"});
  expect_error([] { parse_revision_info(R"({"sha": "x", "siblings": [{"rfilename": "../x"}]})", "u"); },
               {"leaves the repository"});
}

}  // namespace
}  // namespace m3::hub
