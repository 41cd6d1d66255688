// Encode and decode speed of the tokenizer on one large text (single thread).
//   tokenizer_bench --model DIR --file TEXT [--repeat N] [--expect-ids IDS.json]
// Prints a table: case, bytes, tokens, best wall and CPU time, MB/s and tokens/s of CPU time (the
// thread's own CPU seconds, which a busy shared machine distorts far less than wall time). With
// --expect-ids (a JSON array of the reference ids, e.g. from tools/make_tokenizer_golden.py
// --bench-out) it also checks the encoding and exits 1 on a difference.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "cannot open {}", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

struct Timing {
  double wall_s = 1e30;
  double cpu_s = 1e30;
};

template <class F>
Timing best_of(int repeat, F&& run) {
  Timing best;
  for (int i = 0; i < repeat; ++i) {
    const auto wall_start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_seconds();
    run();
    best.cpu_s = std::min(best.cpu_s, thread_cpu_seconds() - cpu_start);
    best.wall_s = std::min(
        best.wall_s,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count());
  }
  return best;
}

void print_row(const char* name, size_t bytes, size_t tokens, Timing t) {
  std::printf("%-20s %9zu %8zu %8.1f %8.1f %8.2f %11.0f\n", name, bytes, tokens, t.wall_s * 1e3,
              t.cpu_s * 1e3, bytes / t.cpu_s / 1e6, tokens / t.cpu_s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tokenizer encode/decode benchmark"};
  std::string model_dir, file, expect_ids;
  int repeat = 3;
  app.add_option("--model", model_dir, "directory with tokenizer.json")->required();
  app.add_option("--file", file, "text to encode")->required();
  app.add_option("--repeat", repeat, "runs per case (the best is reported)");
  app.add_option("--expect-ids", expect_ids, "JSON array of the reference ids");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto tokenizer = m3::text::Tokenizer::load(model_dir);
    const std::string text = read_file(file);
    std::vector<int32_t> ids;
    const Timing encode_t = best_of(repeat, [&] { ids = tokenizer.encode(text, false); });
    std::string decoded;
    const Timing decode_t = best_of(repeat, [&] { decoded = tokenizer.decode(ids, false); });
    std::string streamed;
    const Timing stream_t = best_of(repeat, [&] {
      m3::text::IncrementalDetokenizer detokenizer(tokenizer, false);
      streamed.clear();
      for (const int32_t id : ids) streamed += detokenizer.push(id);
      streamed += detokenizer.finish();
    });
    std::printf("%-20s %9s %8s %8s %8s %8s %11s\n", "case", "bytes", "tokens", "wall_ms",
                "cpu_ms", "MB/s", "tokens/s");
    print_row("encode", text.size(), ids.size(), encode_t);
    print_row("decode", decoded.size(), ids.size(), decode_t);
    print_row("incremental_decode", streamed.size(), ids.size(), stream_t);
    if (streamed != decoded) {
      std::fprintf(stderr, "error: incremental decode differs from one-shot decode\n");
      return 1;
    }
    if (!expect_ids.empty()) {
      const auto expected = nlohmann::json::parse(read_file(expect_ids)).get<std::vector<int32_t>>();
      const auto mismatch = std::mismatch(ids.begin(), ids.end(), expected.begin(), expected.end());
      if (mismatch.first != ids.end() || mismatch.second != expected.end()) {
        std::fprintf(stderr, "error: ids differ from %s at index %td (%zu vs %zu ids)\n",
                     expect_ids.c_str(), mismatch.first - ids.begin(), ids.size(),
                     expected.size());
        return 1;
      }
      std::printf("ids match %s (%zu ids)\n", expect_ids.c_str(), expected.size());
    }
  } catch (const m3::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
