// A Hugging Face repo id as the model, end to end through the m3serve binary: the tiny model's
// files served by tests/hub/mock_hub.py on 127.0.0.1 (HF_ENDPOINT), downloaded into a fresh cache
// (HF_HUB_CACHE / --download-dir), then generate and serve run on it as on the directory itself;
// HF_HUB_OFFLINE uses the cache alone; a name that is neither a directory nor a repo id, and a
// repo the Hub lacks, fail clearly.
#include <gtest/gtest.h>

#include <signal.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tests/hub/mock_hub.h"

namespace {

constexpr const char* kTiny = "models/minimax-m3-tiny";
constexpr const char* kRepo = "MiniMaxAI/MiniMax-M3-Tiny";

struct Result {
  int status = 0;
  std::string out;  // stdout and stderr
};

Result run(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "cannot run " + command};
  Result r;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) r.out.append(buffer.data(), n);
  r.status = pclose(pipe);
  return r;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

std::string generate(const std::string& env, const std::string& model, const std::string& args = "") {
  return fmt::format("env {} {} generate --model {} --device cpu --prompt-ids 5,6,7,8 --max-tokens 6 --json {}", env,
                     M3SERVE_BIN, model, args);
}

std::vector<int> output_ids(const Result& r) {
  const size_t at = r.out.rfind("{\"");
  if (r.status != 0 || at == std::string::npos) return {};
  return nlohmann::json::parse(r.out.substr(at)).at("output_ids").get<std::vector<int>>();
}

struct HubModel : ::testing::Test {
  m3::test::TempDir dir;
  m3::test::MockHub hub{dir.path() / "requests.log", {"--repo", fmt::format("{}={}", kRepo, kTiny), "--extra-files"}};
  std::string env(const std::string& cache) const {
    return fmt::format("HF_ENDPOINT={} HF_HUB_CACHE={} HF_TOKEN= HF_HUB_OFFLINE=", hub.endpoint(),
                       (dir.path() / cache).string());
  }
};

TEST_F(HubModel, GenerateDownloadsTheRepoThenRunsItFromTheCache) {
  const std::vector<int> local = output_ids(run(generate("", kTiny)));
  ASSERT_FALSE(local.empty());
  const Result first = run(generate(env("cache"), kRepo));
  EXPECT_EQ(output_ids(first), local) << first.out;
  EXPECT_TRUE(has(first.out, "downloading MiniMaxAI/MiniMax-M3-Tiny at revision 'main'")) << first.out;
  EXPECT_EQ(hub.requests_for("model.safetensors").size(), 1u);
  EXPECT_TRUE(hub.requests_for("pytorch_model.bin").empty());
  // Offline: the cache alone, by branch and by the commit it points at.
  const Result offline = run(generate(env("cache") + " HF_HUB_OFFLINE=1", kRepo));
  EXPECT_EQ(output_ids(offline), local) << offline.out;
  const Result fresh = run(generate(env("empty") + " HF_HUB_OFFLINE=1", kRepo));
  EXPECT_NE(fresh.status, 0);
  EXPECT_TRUE(has(fresh.out, "HF_HUB_OFFLINE is set and MiniMaxAI/MiniMax-M3-Tiny at revision 'main' is not in the "
                             "Hugging Face cache"))
      << fresh.out;
  // --download-dir is the cache, and --revision picks a tag.
  const Result tagged = run(generate(env("unused"), kRepo, fmt::format("--revision v1 --download-dir {}",
                                                                      (dir.path() / "other").string())));
  EXPECT_EQ(output_ids(tagged), local) << tagged.out;
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "other" / "models--MiniMaxAI--MiniMax-M3-Tiny" / "refs" / "v1"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "unused"));
}

TEST_F(HubModel, NamesThatAreNeitherADirectoryNorAKnownRepoFailClearly) {
  const Result path = run(generate(env("cache"), "./models/no-such/model"));
  EXPECT_NE(path.status, 0);
  EXPECT_TRUE(has(path.out, "--model './models/no-such/model' is neither a directory nor a valid Hugging Face repo id"))
      << path.out;
  const Result missing = run(generate(env("cache"), "MiniMaxAI/No-Such-Model"));
  EXPECT_NE(missing.status, 0);
  EXPECT_TRUE(has(missing.out, "Hugging Face repo 'MiniMaxAI/No-Such-Model' not found (HTTP 404")) << missing.out;
  const Result revision = run(generate(env("cache"), kRepo, "--revision nope"));
  EXPECT_NE(revision.status, 0);
  EXPECT_TRUE(has(revision.out, "no revision 'nope' in MiniMaxAI/MiniMax-M3-Tiny")) << revision.out;
}

TEST_F(HubModel, PlanAndTokenizeFetchOnlyTheFilesTheyRead) {
  const Result plan = run(fmt::format("env {} {} plan {} --num-gpus 1 --gpu-memory-gb 80 --json", env("cache"),
                                      M3SERVE_BIN, kRepo));
  EXPECT_EQ(plan.status, 0) << plan.out;
  EXPECT_TRUE(has(plan.out, "\"max_concurrent_sequences\"")) << plan.out;
  EXPECT_EQ(hub.requests_for("/resolve/").size(), 1u);  // config.json alone
  EXPECT_EQ(hub.requests_for("/resolve/main/config.json").size(), 1u);
  const Result local = run(fmt::format("{} tokenize --model {} --text 'hello world'", M3SERVE_BIN, kTiny));
  const Result tokens = run(fmt::format("env {} {} tokenize --model {} --text 'hello world'", env("cache"),
                                        M3SERVE_BIN, kRepo));
  ASSERT_EQ(local.status, 0) << local.out;
  ASSERT_FALSE(local.out.empty());
  EXPECT_EQ(tokens.status, 0) << tokens.out;
  EXPECT_TRUE(has(tokens.out, local.out)) << tokens.out << "\n" << local.out;
  EXPECT_TRUE(hub.requests_for(".safetensors").empty());
}

TEST_F(HubModel, ServeTakesARepoIdAndReportsItAsTheModelName) {
  const std::string command =
      fmt::format("sh -c 'echo pid $$; exec env {} {} serve {} --device cpu --host 127.0.0.1 --port 0 "
                  "--tokenizer {} --disable-log-stats' 2>&1",
                  env("cache"), M3SERVE_BIN, kRepo, kRepo);
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string log;
  std::string models;
  std::string completion;
  std::array<char, 4096> line;
  long pid = -1;
  int port = 0;
  while (fgets(line.data(), line.size(), pipe) != nullptr) {
    log += line.data();
    if (pid < 0 && std::sscanf(line.data(), "pid %ld", &pid) == 1) continue;
    const char* ready = std::strstr(line.data(), "ready: serving");
    if (ready && pid > 0) {
      if (const char* at = std::strstr(ready, "http://127.0.0.1:")) port = std::atoi(at + std::strlen("http://127.0.0.1:"));
      models = run(fmt::format("curl -s http://127.0.0.1:{}/v1/models", port)).out;
      completion = run(fmt::format("curl -s http://127.0.0.1:{}/v1/completions -H 'Content-Type: application/json' "
                                   "-d '{{\"model\": \"{}\", \"prompt\": \"hello\", \"max_tokens\": 3}}'",
                                   port, kRepo))
                       .out;
      kill(static_cast<pid_t>(pid), SIGTERM);
    }
  }
  EXPECT_EQ(pclose(pipe), 0) << log;
  ASSERT_GT(port, 0) << log;
  const nlohmann::json listed = nlohmann::json::parse(models, nullptr, false);
  ASSERT_FALSE(listed.is_discarded()) << models;
  EXPECT_EQ(listed["data"][0]["id"], kRepo) << models;
  const nlohmann::json done = nlohmann::json::parse(completion, nullptr, false);
  ASSERT_FALSE(done.is_discarded()) << completion;
  EXPECT_EQ(done["usage"]["completion_tokens"], 3) << completion;
  EXPECT_TRUE(has(log, "--tokenizer MiniMaxAI/MiniMax-M3-Tiny (revision main)")) << log;
}

}  // namespace
