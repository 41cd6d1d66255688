// Several hosts (--nnodes) as two m3serve processes on this host, end to end on the CPU: node 0's
// `generate` under -tp 2 / 4 (one and two ranks per node), expert parallel, indexer decode CP and
// DEP (copies of one and two ranks, one and two per node) gives the one-process -tp 1 ids while the follower prints nothing and exits 0 once node 0 is
// done; a follower whose node 0 is killed mid-run, or never comes, exits non-zero naming node 0
// within a bounded time (--node-timeout); a server whose follower is killed stops and exits
// non-zero naming the lost node; nodes given different KV host tiers are refused; and
// the layouts refused across hosts. (The host tier across nodes itself runs in
// server_kv_offloading_nnodes2.)
//
// Ports: each run takes a port the kernel just handed out (bind to port 0) and retries with a new
// one when node 0 finds it taken meanwhile, so parallel ctest runs cannot collide.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

using namespace std::chrono_literals;
constexpr const char* kTiny = "models/minimax-m3-tiny";

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// An m3serve process with its stdout and stderr in files of a scratch folder.
class Process {
 public:
  Process(const std::string& args, const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("m3_multi_node_{}", ::getpid());
    std::filesystem::create_directories(dir);
    out_ = (dir / (name + ".out")).string();
    err_ = (dir / (name + ".err")).string();
    const std::string command = fmt::format("exec {} {} >{} 2>{}", M3SERVE_BIN, args, out_, err_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Process() {
    if (!done_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove(out_, ignored);
    std::filesystem::remove(err_, ignored);
    std::filesystem::remove(std::filesystem::path(out_).parent_path(), ignored);  // once empty
  }
  // The exit status, or -1 (and the process killed) when it runs past `limit`.
  int wait(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        done_ = true;
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        done_ = true;
        status_ = -1;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    return status_;
  }
  // Whether it is still running (without waiting; its status is kept once it exited).
  bool running() {
    int status = 0;
    if (!done_ && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return !done_;
  }
  void kill_now() { ::kill(pid_, SIGKILL); }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = 0;
  std::string out_, err_;
};

std::string generate_args(const std::string& layout, int max_tokens) {
  return fmt::format("generate --model {} --device cpu --dtype float32 --max-tokens {} --json --prompt-ids "
                     "1,2,3,4,5,6,7,8,9,10,11 {}",
                     kTiny, max_tokens, layout);
}

std::string node_args(int node, int port, const std::string& extra = "") {
  return fmt::format("--nnodes 2 --node-rank {} --master-addr 127.0.0.1 --master-port {} {}", node, port, extra);
}

std::vector<int> output_ids(const std::string& out, const std::string& what) {
  const size_t at = out.rfind("{\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << what << ": no JSON in\n" << out;
    return {};
  }
  return nlohmann::json::parse(out.substr(at)).at("output_ids").get<std::vector<int>>();
}

std::vector<int> one_process_ids() {
  Process p(generate_args("", 24), "one");
  EXPECT_EQ(p.wait(120s), 0) << p.err();
  return output_ids(p.out(), "-tp 1");
}

TEST(MultiNodeCommands, TwoNodesGiveOneRanksTokensAndTheFollowerExitsCleanly) {
  const std::vector<int> one = one_process_ids();
  ASSERT_EQ(one.size(), 24u);
  for (const std::string layout : {"-tp 2", "-tp 4", "-tp 2 --enable-expert-parallel",
                                   "-tp 4 --enable-expert-parallel --attention-config '{\"indexer_decode_cp\": true}'",
                                   // DEP: one copy per host, two per host, and copies of -tp 2.
                                   "--data-parallel-size 2 --enable-expert-parallel",
                                   "--data-parallel-size 4 --enable-expert-parallel",
                                   "--data-parallel-size 2 -tp 2 --enable-expert-parallel"}) {
    for (int attempt = 0;; ++attempt) {
      const int port = free_port();
      Process node0(generate_args(layout, 24) + " " + node_args(0, port), "node0");
      Process node1(generate_args(layout, 24) + " " + node_args(1, port), "node1");
      const int status0 = node0.wait(180s);
      if (status0 != 0 && node0.err().find("cannot listen on") != std::string::npos && attempt < 3) continue;
      ASSERT_EQ(status0, 0) << layout << "\n" << node0.err() << "\nfollower:\n" << node1.err();
      EXPECT_EQ(output_ids(node0.out(), layout), one) << layout;
      EXPECT_EQ(node1.wait(30s), 0) << layout << "\n" << node1.err();
      EXPECT_EQ(node1.out(), "") << layout << ": a follower prints nothing on stdout";
      EXPECT_NE(node1.err().find(layout.starts_with("--data") ? "node 0 said stop to every copy here"
                                                                : "node 0 said stop after"),
                std::string::npos)
          << node1.err();
      break;
    }
  }
}

TEST(MultiNodeCommands, AFollowerWhoseNodeZeroIsKilledMidRunExitsNamingNodeZero) {
  const int port = free_port();
  // Long enough a run that node 0 is still generating when it is killed.
  const std::string args = generate_args("-tp 2", 4000) + " --ignore-eos --max-model-len 8192 ";
  Process node0(args + node_args(0, port, "--node-timeout 3"), "kill0");
  Process node1(args + node_args(1, port, "--node-timeout 3"), "kill1");
  const auto loaded_by = std::chrono::steady_clock::now() + 120s;
  while (node1.err().find("following node 0's steps") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), loaded_by) << node1.err();
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(1s);  // a few steps in
  node0.kill_now();
  ASSERT_NE(node0.wait(10s), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int status = node1.wait(30s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_GT(status, 0) << "the follower must exit with an error of its own, not hang\n" << node1.err();
  EXPECT_NE(node1.err().find("node 0"), std::string::npos) << node1.err();
  EXPECT_NE(node1.err().find("error: node 1:"), std::string::npos) << "status " << status << "\n" << node1.err();
}

TEST(MultiNodeCommands, AServerWhoseFollowerIsKilledStopsNamingTheLostNode) {
  // The lost node's ranks held part of every step: node 0 stops serving and exits non-zero
  // (found by its heartbeats while idle, within a fraction of --node-timeout), under -tp and DEP.
  for (const std::string layout : {"-tp 2", "--data-parallel-size 2 --enable-expert-parallel"}) {
    for (int attempt = 0;; ++attempt) {
      const int port = free_port();
      const std::string args = fmt::format("serve {} --device cpu --host 127.0.0.1 --port 0 --max-model-len 512 {} ",
                                           kTiny, layout);
      Process node0(args + node_args(0, port, "--node-timeout 4"), "lost0");
      Process node1(args + node_args(1, port, "--node-timeout 4"), "lost1");
      const auto ready_by = std::chrono::steady_clock::now() + 120s;
      while (node0.err().find("ready: serving") == std::string::npos) {
        if (!node0.running()) break;  // exited early (a port taken meanwhile?)
        ASSERT_LT(std::chrono::steady_clock::now(), ready_by) << node0.err();
        std::this_thread::sleep_for(50ms);
      }
      if (node0.err().find("cannot listen on") != std::string::npos && attempt < 3) continue;
      ASSERT_NE(node0.err().find("ready: serving"), std::string::npos) << layout << "\n" << node0.err();
      node1.kill_now();
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(node0.wait(30s), 1) << layout << "\n" << node0.err();
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s) << layout;
      EXPECT_NE(node0.err().find("a node of the deployment is lost, so the server stopped"), std::string::npos)
          << layout << "\n" << node0.err();
      break;
    }
  }
}

TEST(MultiNodeCommands, AFollowerWhoseNodeZeroNeverComesFailsNamingTheAddress) {
  const int port = free_port();
  Process node1(generate_args("-tp 2", 4) + " " + node_args(1, port, "--node-timeout 1"), "lonely1");
  EXPECT_EQ(node1.wait(30s), 1) << node1.err();
  EXPECT_NE(node1.err().find(fmt::format("rendezvous store at 127.0.0.1:{}", port)), std::string::npos)
      << node1.err();
}

TEST(MultiNodeCommands, NodesGivenDifferentKvHostTiersAreRefusedOnEveryNode) {
  // The engine's host slots index every node's tier, so they must agree (node 0 announces the
  // copies, each node's ranks make their shares).
  for (int attempt = 0;; ++attempt) {
    const int port = free_port();
    Process node0(generate_args("-tp 2 --kv-offloading-size 0.05", 2) + " " + node_args(0, port), "tier0");
    Process node1(generate_args("-tp 2 --kv-offloading-size 0.1", 2) + " " + node_args(1, port), "tier1");
    const int status0 = node0.wait(120s);
    if (status0 != 0 && node0.err().find("cannot listen on") != std::string::npos && attempt < 3) continue;
    EXPECT_EQ(status0, 1) << node0.err();
    EXPECT_EQ(node1.wait(60s), 1) << node1.err();
    for (const std::string& err : {node0.err(), node1.err()}) {
      EXPECT_NE(err.find("the nodes' KV host tiers differ"), std::string::npos) << err;
      EXPECT_NE(err.find("start every node with the same --kv-offloading-size"), std::string::npos) << err;
    }
    break;
  }
}

TEST(MultiNodeCommands, LayoutsThatCannotRunAcrossHostsAreRefused) {
  const auto refused = [](const std::string& args, const std::string& message) {
    Process p(fmt::format("generate --model {} --device cpu --prompt-ids 1,2,3 {}", kTiny, args), "refused");
    EXPECT_EQ(p.wait(30s), 1) << args;
    EXPECT_NE(p.err().find(message), std::string::npos) << args << "\n" << p.err();
  };
  refused("-tp 3 --nnodes 2 --master-addr 127.0.0.1", "-tp 3 is not a multiple of --nnodes 2");
  refused("--data-parallel-size 3 --enable-expert-parallel --nnodes 2 --master-addr 127.0.0.1",
          "--data-parallel-size 3 is not a multiple of --nnodes 2");
  refused("-tp 2 --nnodes 2", "give --master-addr");
  refused("-tp 2 --nnodes 2 --node-rank 2 --master-addr 127.0.0.1", "--node-rank 2 outside [0, --nnodes 2)");
  refused("-tp 2 --nnodes 2 --master-addr 127.0.0.1 --node-timeout 0", "--node-timeout must be > 0");
}

}  // namespace
