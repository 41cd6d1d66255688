// nccl_communicator_check: the NCCL Communicator (parallel/nccl_communicator.h) on the GPUs of this
// machine, one thread per rank in one process (as the server will run a group), rank r on device r.
//
//   nccl_communicator_check [--seed N] [--world N]... [--verbose]
//
// World sizes: 1, 2 and the number of visible GPUs (each once; 1 alone on a one-GPU machine), or
// those given with --world. In each, every collective runs on fresh random inputs and every rank
// checks its result against the host's (tests/parallel/nccl_check_expect.h: inputs, expected
// values, the tolerances of sums): all_reduce (F32, BF16, I32; sum, max; sizes from one element to
// 1M), all_reduce results bitwise equal on every rank, all_gather, reduce_scatter, all_to_all with
// uneven splits (zero rows to and from some peers, to itself, and nothing at all), broadcast from
// the first and the last rank, barrier, an all_reduce + all_gather captured in one CUDA graph and
// replayed on new inputs, and the shape errors (thrown before anything is enqueued, naming the
// collective and the group). Ranks wait by polling the stream and poll_error(), and stop when
// another rank failed, so a failure ends the run instead of hanging it.
//
// Prints a table (collective x world size: checks passed), each failure, and last one line
// "nccl_communicator_check: N passed, F failed ..."; --verbose prints every check first. Exit
// status: 0 all passed, 1 one failed, 2 bad arguments, 77 (CTest's SKIP_RETURN_CODE) when no CUDA
// device is usable (CI).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/nccl_communicator.h"
#include "tests/parallel/nccl_check_expect.h"

namespace m3::test {
namespace {

constexpr int kSkipped = 77;
// Long past any collective here (milliseconds each), short of a CI step's limit.
constexpr auto kWaitLimit = std::chrono::seconds(60);
constexpr const char* kGroup = "check";

void cuda_ok(cudaError_t err, std::string_view what) {
  if (err != cudaSuccess) fail("{}: {}: {}", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

struct CaseLog {
  std::string collective;  // the table's row
  std::string name;
  Verdict verdict;
  Bytes result;  // all_reduce: this rank's result, compared across ranks afterwards
};

// One world size: the id its ranks connect with and what each rank found.
struct World {
  int size = 1;
  uint64_t seed = 1;
  NcclUniqueId id;
  std::atomic<bool> failed{false};  // a rank stopped: the others stop waiting for it
  std::vector<std::vector<CaseLog>> logs;  // [rank]
};

// Rows rank `src` sends to rank `dst` in an all_to_all.
using RowPattern = std::function<int64_t(int src, int dst)>;

// One rank's thread: connect, run every case in the same order as the other ranks (the case
// counter also seeds the inputs, so all ranks draw the same ones), log the verdicts.
class RankCheck {
 public:
  RankCheck(World& world, int rank) : w_(world), rank_(rank), log_(world.logs[rank]) {}
  ~RankCheck() {
    comm_.reset();  // before its stream and buffers
    buffers_.clear();
    if (stream_) cudaStreamDestroy(stream_);
  }
  void run();

 private:
  void cases();
  void all_reduce(DType dtype, ReduceOp op, int64_t numel);
  void all_gather(DType dtype, int64_t numel);
  void reduce_scatter(DType dtype, int64_t per_rank);
  void all_to_all(DType dtype, int64_t cols, const std::string& pattern_name, const RowPattern& rows);
  void broadcast(DType dtype, int64_t numel, int root);
  void barrier();
  void graph_replays(int replays);
  void shape_errors();
  void expect_error(const std::string& name, const std::function<void()>& call, std::string_view needle);

  // The start of each case: the previous case's buffers go (its work was waited for), and the
  // next seed of the inputs.
  int begin_case() {
    buffers_.clear();
    return next_id();
  }
  int next_id() { return case_id_++; }
  std::vector<Bytes> inputs(DType dtype, int64_t numel, int id) const;
  Tensor device(DType dtype, Shape shape);
  Tensor upload(DType dtype, Shape shape, const Bytes& bytes);
  void poison(const Tensor& t);
  Bytes download(const Tensor& t);
  void wait();
  void record(std::string collective, std::string name, Verdict verdict, Bytes result = {});
  std::string where() const { return fmt::format("world {} rank {}", w_.size, rank_); }

  World& w_;
  const int rank_;
  std::vector<CaseLog>& log_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclCommunicator> comm_;
  // Device memory of the current case, freed once it is done: after a failure only after the
  // communicator is aborted, since cudaFree waits for kernels that may be stuck on a lost peer.
  std::vector<std::shared_ptr<void>> buffers_;
  int case_id_ = 0;
};

void RankCheck::run() {
  try {
    cuda_ok(cudaSetDevice(rank_), where() + ": cudaSetDevice");
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where() + ": cudaStreamCreate");
    comm_ = connect_nccl(w_.id, rank_, w_.size, rank_, stream_, kGroup);
    M3_CHECK(comm_->rank() == rank_ && comm_->size() == w_.size && comm_->engine() == "nccl" &&
                 comm_->group_name() == kGroup && comm_->stream() == stream_,
             "{}: the communicator reports rank {} of {}, engine {}, group {}", where(), comm_->rank(), comm_->size(),
             comm_->engine(), comm_->group_name());
    cases();
  } catch (const std::exception& e) {
    w_.failed = true;
    log_.push_back({"error", "stopped", {false, e.what()}, {}});
    if (comm_) comm_->abort();
  }
  buffers_.clear();
}

void RankCheck::cases() {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (int64_t numel : {int64_t{1}, int64_t{4099}}) all_reduce(dtype, op, numel);
    }
  }
  all_reduce(DType::kF32, ReduceOp::kSum, int64_t{1} << 20);  // past the small-message protocols
  all_reduce(DType::kBF16, ReduceOp::kSum, (int64_t{1} << 20) + 3);
  all_gather(DType::kBF16, 1023);
  all_gather(DType::kU8, 1);
  all_gather(DType::kF32, 100003);
  reduce_scatter(DType::kF32, 4097);
  reduce_scatter(DType::kBF16, 1000);
  reduce_scatter(DType::kI32, 33);
  all_to_all(DType::kBF16, 7, "uneven", [](int s, int d) { return int64_t{(s * 5 + d * 3 + 1) % 4}; });
  all_to_all(DType::kF32, 128, "none to itself",
             [](int s, int d) { return s == d ? 0 : int64_t{1 + (s + 2 * d) % 3}; });
  all_to_all(DType::kU8, 33, "large", [](int s, int d) { return int64_t{100 + 37 * s + 11 * d}; });
  all_to_all(DType::kBF16, 16, "nothing", [](int, int) { return int64_t{0}; });
  broadcast(DType::kU8, 12345, 0);
  broadcast(DType::kF32, 1 << 18, w_.size - 1);
  barrier();
  graph_replays(3);
  shape_errors();  // last: a shape error that slipped through to NCCL would put the ranks out of step
}

std::vector<Bytes> RankCheck::inputs(DType dtype, int64_t numel, int id) const {
  std::vector<Bytes> in;
  for (int r = 0; r < w_.size; ++r) in.push_back(random_input(dtype, numel, w_.seed, id, r));
  return in;
}

Tensor RankCheck::device(DType dtype, Shape shape) {
  const std::size_t bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  void* p = nullptr;
  if (bytes) {
    cuda_ok(cudaMalloc(&p, bytes), where() + ": cudaMalloc");
    buffers_.emplace_back(p, [](void* q) { cudaFree(q); });
  }
  return Tensor::wrap(p, std::move(shape), dtype, Device::kCuda);
}

Tensor RankCheck::upload(DType dtype, Shape shape, const Bytes& bytes) {
  Tensor t = device(dtype, std::move(shape));
  M3_CHECK(t.nbytes() == bytes.size(), "{}: {} bytes for a tensor of {}", where(), bytes.size(), t.nbytes());
  if (!bytes.empty()) {
    cuda_ok(cudaMemcpyAsync(t.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream_),
            where() + ": upload");
  }
  return t;
}

// 0xff everywhere: NaN in F32 and BF16, so an output the collective did not write cannot pass.
void RankCheck::poison(const Tensor& t) {
  if (t.nbytes()) cuda_ok(cudaMemsetAsync(t.data(), 0xff, t.nbytes(), stream_), where() + ": poison");
}

// Waits first by polling: a copy to pageable memory would block in the driver until the stream
// gets there, past any lost peer.
Bytes RankCheck::download(const Tensor& t) {
  wait();
  Bytes out(t.nbytes());
  if (!out.empty()) {
    cuda_ok(cudaMemcpyAsync(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost, stream_), where() + ": download");
    wait();
  }
  return out;
}

// What the runner does: poll the stream and the communicator, give up when another rank failed.
void RankCheck::wait() {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_ok(q, where() + ": the stream");
    comm_->poll_error();
    M3_CHECK(!w_.failed, "{}: stopped waiting: another rank failed", where());
    M3_CHECK(std::chrono::steady_clock::now() - start < kWaitLimit, "{}: the stream is not done after {} s", where(),
             kWaitLimit.count());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void RankCheck::record(std::string collective, std::string name, Verdict verdict, Bytes result) {
  log_.push_back({std::move(collective), std::move(name), std::move(verdict), std::move(result)});
}

std::string op_name(ReduceOp op) { return op == ReduceOp::kMax ? "max" : "sum"; }

Bytes concat(const std::vector<Bytes>& parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

void RankCheck::all_reduce(DType dtype, ReduceOp op, int64_t numel) {
  const std::vector<Bytes> in = inputs(dtype, numel, begin_case());
  Tensor x = upload(dtype, {numel}, in[rank_]);
  comm_->all_reduce(x, op);
  Bytes got = download(x);
  Verdict v = check_reduction(dtype, op, in, 0, numel, got);
  record("all_reduce", fmt::format("{} {} x{}", dtype_name(dtype), op_name(op), numel), std::move(v), std::move(got));
}

void RankCheck::all_gather(DType dtype, int64_t numel) {
  const std::vector<Bytes> in = inputs(dtype, numel, begin_case());
  Tensor x = upload(dtype, {numel}, in[rank_]);
  Tensor out = device(dtype, {w_.size * numel});
  poison(out);
  comm_->all_gather(x, out);
  record("all_gather", fmt::format("{} x{} per rank", dtype_name(dtype), numel),
         check_bytes(concat(in), download(out)));
}

void RankCheck::reduce_scatter(DType dtype, int64_t per_rank) {
  const std::vector<Bytes> in = inputs(dtype, w_.size * per_rank, begin_case());
  Tensor x = upload(dtype, {w_.size * per_rank}, in[rank_]);
  Tensor out = device(dtype, {per_rank});
  poison(out);
  comm_->reduce_scatter(x, out);
  record("reduce_scatter", fmt::format("{} sum x{} per rank", dtype_name(dtype), per_rank),
         check_reduction(dtype, ReduceOp::kSum, in, rank_ * per_rank, per_rank, download(out)));
}

// Each source rank's input holds the rows for every destination in rank order; this rank expects
// the part of each source's input addressed to it, in source order.
void RankCheck::all_to_all(DType dtype, int64_t cols, const std::string& pattern_name, const RowPattern& rows) {
  const int id = begin_case();
  const int n = w_.size;
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * dtype_size(dtype);
  std::vector<int64_t> send(n), recv(n);
  Bytes mine, expected;
  for (int src = 0; src < n; ++src) {
    int64_t total = 0, before_me = 0;
    for (int dst = 0; dst < n; ++dst) {
      if (dst == rank_) before_me = total;
      total += rows(src, dst);
    }
    const Bytes in = random_input(dtype, total * cols, w_.seed, id, src);
    if (src == rank_) mine = in;
    const auto part = in.begin() + static_cast<std::ptrdiff_t>(before_me * row_bytes);
    expected.insert(expected.end(), part, part + static_cast<std::ptrdiff_t>(rows(src, rank_) * row_bytes));
    send[src] = rows(rank_, src);
    recv[src] = rows(src, rank_);
  }
  int64_t send_total = 0, recv_total = 0;
  for (int r = 0; r < n; ++r) send_total += send[r], recv_total += recv[r];
  Tensor x = upload(dtype, {send_total, cols}, mine);
  Tensor out = device(dtype, {recv_total, cols});
  poison(out);
  comm_->all_to_all(x, send, out, recv);
  record("all_to_all",
         fmt::format("{} {} ({} rows out, {} in)", dtype_name(dtype), pattern_name, send_total, recv_total),
         check_bytes(expected, download(out)));
}

void RankCheck::broadcast(DType dtype, int64_t numel, int root) {
  const std::vector<Bytes> in = inputs(dtype, numel, begin_case());
  Tensor x = upload(dtype, {numel}, in[rank_]);
  comm_->broadcast(x, root);
  record("broadcast", fmt::format("{} x{} from rank {}", dtype_name(dtype), numel, root),
         check_bytes(in[root], download(x)));
}

void RankCheck::barrier() {
  begin_case();
  for (int i = 0; i < 3; ++i) comm_->barrier();
  wait();
  record("barrier", "3 in a row", {true, "completed"});
}

// Captured once, replayed with new inputs written into the captured buffers: the graph must read
// the buffers, not the values at capture time.
void RankCheck::graph_replays(int replays) {
  constexpr int64_t kReduce = 4099, kGather = 513;
  begin_case();
  Tensor x = device(DType::kF32, {kReduce});
  Tensor part = device(DType::kBF16, {kGather});
  Tensor gathered = device(DType::kBF16, {w_.size * kGather});
  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ~Graph() {
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
    }
  } g;
  // Thread-local: the other ranks' threads keep allocating while this one captures.
  cuda_ok(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), where() + ": begin capture");
  try {
    comm_->all_reduce(x, ReduceOp::kSum);
    comm_->all_gather(part, gathered);
  } catch (...) {
    cudaStreamEndCapture(stream_, &g.graph);
    throw;
  }
  cuda_ok(cudaStreamEndCapture(stream_, &g.graph), where() + ": end capture");
  cuda_ok(cudaGraphInstantiate(&g.exec, g.graph, 0), where() + ": instantiate");
  for (int replay = 0; replay < replays; ++replay) {
    const std::vector<Bytes> xs = inputs(DType::kF32, kReduce, next_id());
    const std::vector<Bytes> parts = inputs(DType::kBF16, kGather, next_id());
    cuda_ok(cudaMemcpyAsync(x.data(), xs[rank_].data(), x.nbytes(), cudaMemcpyHostToDevice, stream_), where());
    cuda_ok(cudaMemcpyAsync(part.data(), parts[rank_].data(), part.nbytes(), cudaMemcpyHostToDevice, stream_), where());
    poison(gathered);
    cuda_ok(cudaGraphLaunch(g.exec, stream_), where() + ": graph launch");
    Verdict reduce = check_reduction(DType::kF32, ReduceOp::kSum, xs, 0, kReduce, download(x));
    Verdict gather = check_bytes(concat(parts), download(gathered));
    Verdict v{reduce.ok && gather.ok, fmt::format("all_reduce: {}; all_gather: {}", reduce.detail, gather.detail)};
    record("graph", fmt::format("replay {}: all_reduce F32 x{} + all_gather BF16 x{}", replay, kReduce, kGather),
           std::move(v));
  }
  wait();
}

void RankCheck::expect_error(const std::string& name, const std::function<void()>& call, std::string_view needle) {
  Verdict v;
  try {
    call();
    v = {false, "no error"};
  } catch (const Error& e) {
    const std::string msg = e.what();
    const bool named =
        msg.find(needle) != std::string::npos && msg.find(fmt::format("group {}", kGroup)) != std::string::npos;
    v = {named, named ? msg : "the message lacks \"" + std::string(needle) + "\" or the group: " + msg};
  }
  record("shape errors", name, std::move(v));
}

// Every call below fails its checks before anything is enqueued, on every rank alike.
void RankCheck::shape_errors() {
  begin_case();
  Tensor a = device(DType::kBF16, {64});
  Tensor small = device(DType::kBF16, {64 * w_.size - 1});
  Tensor shared = device(DType::kBF16, {64 * w_.size + 1});
  Tensor bytes = device(DType::kI8, {64});
  Tensor odd = device(DType::kF32, {w_.size * 3 + 1});
  Tensor rows_in = device(DType::kF32, {5 * w_.size + 1, 4});
  Tensor rows_out = device(DType::kF32, {5 * w_.size, 4});
  Tensor host = Tensor::zeros({64}, DType::kBF16);
  std::vector<int64_t> five_each(w_.size, 5);
  expect_error("all_gather into too small an out", [&] { comm_->all_gather(a, small); }, "all_gather");
  expect_error("all_reduce of I8", [&] { comm_->all_reduce(bytes); }, "I8");
  if (w_.size > 1) {
    expect_error("reduce_scatter of a size that does not split",
                 [&] { comm_->reduce_scatter(odd, device(DType::kF32, {3})); }, "reduce_scatter");
  }
  expect_error("all_to_all send_rows not adding up to in",
               [&] { comm_->all_to_all(rows_in, five_each, rows_out, five_each); }, "send_rows");
  expect_error("all_gather with in inside out",
               [&] { comm_->all_gather(shared.rows(1, 65), shared.rows(0, 64 * w_.size)); }, "overlap");
  expect_error("broadcast from a root outside the group", [&] { comm_->broadcast(a, w_.size); }, "root");
  expect_error("all_reduce of a host tensor", [&] { comm_->all_reduce(host); }, "CUDA tensor");
}

// ---- the driver ----

// Bitwise agreement of the all_reduce results across ranks (ring and tree both end with every
// rank copying one reduced chunk, so tensor-parallel ranks see the same activations).
void compare_across_ranks(World& w) {
  std::vector<CaseLog>& first = w.logs[0];
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (first[i].collective != "all_reduce") continue;
    for (int r = 1; r < w.size; ++r) {
      if (i >= w.logs[r].size() || w.logs[r][i].name != first[i].name) continue;
      if (w.logs[r][i].result != first[i].result) {
        first[i].verdict.ok = false;
        first[i].verdict.detail += fmt::format("; rank {} holds other bits than rank 0", r);
      }
    }
  }
}

// A check across the ranks of one world: it passes when it passed on every rank.
struct Outcome {
  std::string collective, name;
  bool ok = true;
  std::string detail;                 // rank 0's
  std::vector<std::string> failures;  // "rank r: why"
};

// Rank 0's list of checks, with every rank's verdicts folded in; a rank that stopped adds its
// error as a check of its own (it failed).
std::vector<Outcome> outcomes(const World& w) {
  std::vector<Outcome> out;
  for (const CaseLog& c : w.logs[0]) out.push_back({c.collective, c.name, true, c.verdict.detail, {}});
  const std::size_t cases = out.size();
  for (int r = 0; r < w.size; ++r) {
    for (std::size_t i = 0; i < w.logs[r].size(); ++i) {
      const CaseLog& c = w.logs[r][i];
      std::size_t at = i;
      if (i >= cases || out[i].collective != c.collective || out[i].name != c.name) {
        out.push_back({c.collective, c.name, true, c.verdict.detail, {}});
        at = out.size() - 1;
      }
      if (!c.verdict.ok) {
        out[at].ok = false;
        out[at].failures.push_back(fmt::format("rank {}: {}", r, c.verdict.detail));
      }
    }
  }
  return out;
}

void run_world(World& w) {
  w.id = make_nccl_unique_id();
  w.logs.assign(w.size, {});
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size; ++r) {
    threads.emplace_back([&w, r] { RankCheck(w, r).run(); });
  }
  for (auto& t : threads) t.join();
  compare_across_ranks(w);
}

std::string nccl_runtime_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

int main_impl(int argc, char** argv) {
  uint64_t seed = 1;
  bool verbose = false;
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = std::stoull(argv[++i]);
    else if (!std::strcmp(argv[i], "--world") && i + 1 < argc) sizes.push_back(std::stoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--verbose")) verbose = true;
    else {
      std::fprintf(stderr, "usage: nccl_communicator_check [--seed N] [--world N]... [--verbose]\n");
      return 2;
    }
  }
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus == 0) {
    std::printf("nccl_communicator_check: no usable CUDA device (%s): skipped (run on the GPU machine, "
                "scripts/gpu-session-check.sh)\n", err == cudaSuccess ? "none visible" : cudaGetErrorName(err));
    return kSkipped;
  }
  if (sizes.empty()) sizes = gpus >= 2 ? std::vector<int>{1, 2, gpus} : std::vector<int>{1};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int s : sizes) {
    if (s < 1 || s > gpus) {
      std::fprintf(stderr, "nccl_communicator_check: world size %d needs 1..%d GPUs\n", s, gpus);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  std::printf("nccl_communicator_check: %d x %s, NCCL %s (built against %d.%d.%d), NCCL_NVLS_ENABLE=%s, seed %llu\n",
              gpus, prop.name, nccl_runtime_version().c_str(), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
              nvls ? nvls : "(unset)",
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  // collective -> world size -> (passed, checks); failures in full.
  std::map<std::string, std::map<int, std::pair<int, int>>> table;
  std::vector<std::string> rows_in_order, failures;
  int passed = 0, failed = 0;
  for (int size : sizes) {
    World w;
    w.size = size;
    w.seed = seed;
    run_world(w);
    for (const Outcome& o : outcomes(w)) {
      if (!table.count(o.collective)) rows_in_order.push_back(o.collective);
      auto& cell = table[o.collective][size];
      cell.second++;
      if (o.ok) cell.first++, passed++;
      else failed++;
      for (const std::string& f : o.failures) {
        failures.push_back(fmt::format("FAIL world {} {} {}: {}", size, o.collective, o.name, f));
      }
      if (verbose) {
        std::printf("  world %d: %-14s %-52s %s  %s\n", size, o.collective.c_str(), o.name.c_str(),
                    o.ok ? "ok  " : "FAIL", o.detail.c_str());
      }
    }
  }
  std::printf("%-16s", "collective");
  for (int s : sizes) std::printf("  world %-4d", s);
  std::printf("\n");
  for (const std::string& row : rows_in_order) {
    std::printf("%-16s", row.c_str());
    for (int s : sizes) {
      const auto it = table[row].find(s);
      const std::string cell = it == table[row].end() ? "-" : fmt::format("{}/{}", it->second.first, it->second.second);
      std::printf("  %-10s", cell.c_str());
    }
    std::printf("\n");
  }
  for (const std::string& f : failures) std::printf("%s\n", f.c_str());
  std::string worlds;
  for (int s : sizes) worlds += (worlds.empty() ? "" : ", ") + std::to_string(s);
  std::printf("nccl_communicator_check: %d passed, %d failed (world sizes %s)\n", passed, failed, worlds.c_str());
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace m3::test

int main(int argc, char** argv) {
  try {
    return m3::test::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_communicator_check: error: %s\n", e.what());
    return 1;
  }
}
