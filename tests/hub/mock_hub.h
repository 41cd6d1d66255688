// tests/hub/mock_hub.py as a child process of a test: started on a free port of 127.0.0.1,
// stopped (by its pid) when the MockHub goes away; the requests it saw, from its log.
#pragma once
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace m3::test {

// A fresh empty folder under the system's temp directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "m3hub-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

class MockHub {
 public:
  // args: mock_hub.py's options, e.g. {"--repo", "org/name=DIR", "--drop-once", "a.safetensors"}.
  MockHub(const std::filesystem::path& log, std::vector<std::string> args) : log_(log) {
    std::vector<std::string> argv = {"python3", "tests/hub/mock_hub.py", "--log", log.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    const int status = ::posix_spawnp(&pid_, "python3", &actions, nullptr, raw.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    if (status != 0) throw std::runtime_error("cannot start tests/hub/mock_hub.py");
    FILE* from = ::fdopen(out[0], "r");
    char line[128] = {};
    if (std::fgets(line, sizeof line, from) == nullptr || std::sscanf(line, "PORT %d", &port_) != 1) {
      std::fclose(from);
      stop();
      throw std::runtime_error("tests/hub/mock_hub.py did not start");
    }
    std::fclose(from);
  }
  ~MockHub() { stop(); }
  MockHub(const MockHub&) = delete;
  MockHub& operator=(const MockHub&) = delete;

  int port() const { return port_; }
  std::string endpoint(const std::string& scheme = "http") const {
    return scheme + "://127.0.0.1:" + std::to_string(port_);
  }

  // Every request so far: {"path", "range", "authorization"}.
  std::vector<nlohmann::json> requests() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  // The requests whose path contains `part`.
  std::vector<nlohmann::json> requests_for(const std::string& part) const {
    std::vector<nlohmann::json> out;
    for (const nlohmann::json& r : requests()) {
      if (r["path"].get<std::string>().find(part) != std::string::npos) out.push_back(r);
    }
    return out;
  }

 private:
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::filesystem::path log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace m3::test
