// m3serve bench http: the HTTP server's own overhead on streamed tokens. The serving engine and
// an OpenAIServer run in this process on a loopback port; one client thread opens N streaming
// completions at once (raw sockets under epoll, so the client costs little) and reads them to
// [DONE]. Reported per level:
//   - token to socket: from the engine handing a token over to its SSE bytes being written to the
//     client's socket (m3:token_to_socket_seconds, measured inside the server), p50 / p99;
//   - server CPU: the CPU time of the threads the HTTP server started (not the engine's, not the
//     client's), per 1,000 streamed tokens/s, i.e. the cores the HTTP layer needs at that rate.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "app/model_loader.h"
#include "app/model_source.h"
#include "app/node_follower.h"
#include "core/error.h"
#include "core/log.h"
#include "server/openai_server.h"
#include "server/sampling_params.h"

namespace m3::app {
namespace {

using BenchClock = std::chrono::steady_clock;

struct BenchHttpOptions {
  ModelOptions model;
  EngineOptions engine;
  std::string streams = "1,100,2000";
  int max_tokens = 32;
  int max_connections = 0;  // 0: the server's default
  int io_threads = 0;       // 0: the server's default
};

std::set<int> thread_ids() {
  std::set<int> ids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    ids.insert(std::stoi(entry.path().filename().string()));
  }
  return ids;
}

// CPU time of one thread of this process, in seconds (0 if it has exited), from schedstat's
// nanoseconds: /proc's utime/stime are whole clock ticks per thread, which rounds the short
// bursts of a thread-per-connection server's many threads down to nothing.
double thread_cpu_seconds(int tid) {
  std::ifstream in(fmt::format("/proc/self/task/{}/schedstat", tid));
  double ns = 0.0;
  if (!(in >> ns)) return 0.0;
  return ns * 1e-9;
}

double cpu_seconds(const std::set<int>& tids) {
  double total = 0.0;
  for (int tid : tids) total += thread_cpu_seconds(tid);
  return total;
}

struct LevelResult {
  int streams = 0;
  int completed = 0;  // streams that reached [DONE]
  double wall_s = 0.0;
  uint64_t tokens = 0;
  double p50_us = 0.0, p99_us = 0.0;
  double server_cpu_s = 0.0;
};

// Opens `n` streaming requests at once and reads every one to its end under epoll (so the
// client's cost grows with the bytes it reads, not with the number of connections); returns how
// many saw [DONE].
int run_clients(int port, int n, const std::string& request) {
  std::vector<int> fds(n, -1);
  std::vector<std::string> tails(n);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int epoll = ::epoll_create1(0);
  M3_CHECK(epoll >= 0, "bench: epoll_create1 failed");
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    M3_CHECK(fd >= 0, "bench: socket() failed (open-file limit?)");
    M3_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
             "bench: connect to 127.0.0.1:{} failed", port);
    M3_CHECK(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(request.size()),
             "bench: send failed");
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u32 = static_cast<uint32_t>(i);
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
    fds[i] = fd;
  }
  int open = n, completed = 0;
  const auto deadline = BenchClock::now() + std::chrono::minutes(10);
  std::vector<epoll_event> ready(256);
  char buffer[65536];
  while (open > 0 && BenchClock::now() < deadline) {
    const int count = ::epoll_wait(epoll, ready.data(), static_cast<int>(ready.size()), 1000);
    for (int r = 0; r < count; ++r) {
      const int i = static_cast<int>(ready[r].data.u32);
      if (fds[i] < 0) continue;
      ssize_t got = ::recv(fds[i], buffer, sizeof buffer, 0);
      if (got > 0) {
        // Keep only the last bytes: enough to see the [DONE] marker across reads.
        tails[i].append(buffer, static_cast<size_t>(got));
        if (tails[i].find("data: [DONE]") == std::string::npos) {
          if (tails[i].size() > 64) tails[i].erase(0, tails[i].size() - 64);
          continue;
        }
        ++completed;
      } else if (got < 0 && errno == EINTR) {
        continue;
      }
      ::close(fds[i]);  // also leaves the epoll set
      fds[i] = -1;
      --open;
    }
  }
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  ::close(epoll);
  return completed;
}

LevelResult run_level(const BenchHttpOptions& o, std::shared_ptr<const server::ModelContext> model,
                      int streams) {
  server::ServeOptions serve;
  serve.host = "127.0.0.1";
  serve.port = 0;
  serve.served_model_names = {"bench"};
  serve.version = "bench";
  if (o.max_connections > 0) serve.http.max_connections = o.max_connections;
  if (o.io_threads > 0) serve.http.io_threads = o.io_threads;
  const std::set<int> before = thread_ids();
  server::OpenAIServer server(serve);
  const int port = server.start();
  server.set_model(model);
  std::set<int> server_threads;
  for (int tid : thread_ids()) {
    if (!before.count(tid)) server_threads.insert(tid);
  }
  const std::string body = fmt::format(
      R"({{"prompt":"The quick brown fox","max_tokens":{},"ignore_eos":true,"stream":true}})",
      o.max_tokens);
  const std::string request = fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
      body.size(), body);

  LevelResult r;
  r.streams = streams;
  const uint64_t tokens_before = model->engine->stats().generation_tokens_total;
  const double cpu_before = cpu_seconds(server_threads);
  const auto start = BenchClock::now();
  r.completed = run_clients(port, streams, request);
  r.wall_s = std::chrono::duration<double>(BenchClock::now() - start).count();
  // Threads the server started after start() (a thread-per-connection server would grow its pool here; Asio starts all at once)
  // are counted too.
  for (int tid : thread_ids()) {
    if (!before.count(tid)) server_threads.insert(tid);
  }
  r.server_cpu_s = cpu_seconds(server_threads) - cpu_before;
  r.tokens = model->engine->stats().generation_tokens_total - tokens_before;
  const server::LatencySummary& latency = server.context().metrics().token_to_socket();
  r.p50_us = 1e6 * latency.quantile(0.5);
  r.p99_us = 1e6 * latency.quantile(0.99);
  server.stop();
  return r;
}

void run_bench_http(BenchHttpOptions o) {
  locate_model(o.model);
  // 2,000 client sockets and as many server sockets: lift the soft open-file limit to the hard one.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  std::vector<int> levels;
  std::stringstream list(o.streams);
  for (std::string item; std::getline(list, item, ',');) levels.push_back(std::stoi(item));
  M3_CHECK(!levels.empty(), "bench http: --streams is empty");

  LoadedModel loaded = load_model(o.model, o.engine, KvDemand{o.engine.max_num_seqs, 0, false});
  if (loaded.follower()) return follow_node_zero(loaded, o.model, o.engine);
  std::unique_ptr<EngineCore> engine = make_engine(loaded, o.model, o.engine);
  text::Tokenizer tokenizer = text::Tokenizer::load(o.model.model_dir);
  auto model = std::make_shared<server::ModelContext>(server::ModelContext{
      tokenizer, std::nullopt, engine.get(), server::GenerationDefaults{}, {},
      engine->max_model_len(), engine->vocab_size()});
  engine->start();

  fmt::print("{:>8} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>14}\n", "streams", "completed",
             "wall_s", "tok/s", "p50_us", "p99_us", "server_cpu", "cores/1k_tok/s");
  for (int n : levels) {
    LevelResult r = run_level(o, model, n);
    const double tok_per_s = r.tokens / r.wall_s;
    const double cores_per_1k = (r.server_cpu_s / r.wall_s) / (tok_per_s / 1000.0);
    fmt::print("{:>8} {:>9} {:>8.2f} {:>9.0f} {:>10.1f} {:>10.1f} {:>10.3f} {:>14.4f}\n", n,
               r.completed, r.wall_s, tok_per_s, r.p50_us, r.p99_us, r.server_cpu_s,
               cores_per_1k);
    std::fflush(stdout);
  }
  engine->shutdown(false);
}

}  // namespace

void register_bench_http(CLI::App& app) {
  auto o = std::make_shared<BenchHttpOptions>();
  CLI::App* bench = app.get_subcommand("bench");  // created by register_bench_serve
  auto* cmd = bench->add_subcommand(
      "http", "the HTTP server's own overhead per streamed token (in process, loopback)");
  add_model_options(*cmd, o->model);
  cmd->add_option("--streams", o->streams, "comma-separated numbers of concurrent streams")
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens per stream (eos ignored)")
      ->capture_default_str();
  add_engine_options(*cmd, o->engine);
  cmd->add_option("--max-connections", o->max_connections,
                  "the server's connection limit (0: its default)")
      ->capture_default_str();
  cmd->add_option("--io-threads", o->io_threads,
                  "the server's I/O threads (0: its default)")
      ->capture_default_str();
  cmd->callback([o] { run_bench_http(*o); });
}

}  // namespace m3::app
