// vLLM's serve flags as users type them, end to end through the m3serve binary: each flag with a
// meaning has its effect (or its clear refusal), each vLLM flag without a counterpart is accepted
// with its one-line log, and a misspelled flag fails naming the closest valid one. The HTTP side
// of the serve flags (prompt_tokens_details, --tokenizer, --seed over two servers) is in
// tests/server/test_http_api.py.
#include <gtest/gtest.h>

#include <signal.h>

#include <array>
#include <cstdio>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

constexpr const char* kTiny = "models/minimax-m3-tiny";
constexpr const char* kSmall = "models/minimax-m3-small";  // MXFP8 weights, NVFP4 experts

struct Result {
  int status = 0;
  std::string out;  // stdout and stderr
};

Result run_m3serve(const std::string& args) {
  const std::string command = fmt::format("{} {} 2>&1", M3SERVE_BIN, args);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "cannot run " + command};
  Result r;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) r.out.append(buffer.data(), n);
  r.status = pclose(pipe);
  return r;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

void expect_refused(const std::string& args, const std::string& message) {
  const Result r = run_m3serve(args);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_TRUE(has(r.out, message)) << args << "\n" << r.out;
}

std::string generate(const std::string& model, const std::string& args, int max_tokens = 12) {
  return fmt::format("generate --model {} --device cpu --prompt-ids 5,6,7,8 --max-tokens {} {}", model, max_tokens,
                     args);
}

std::vector<int> output_ids(const std::string& args) {
  const Result r = run_m3serve(generate(kTiny, "--json " + args));
  EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
  const size_t at = r.out.rfind("{\"");
  if (at == std::string::npos) return {};
  return nlohmann::json::parse(r.out.substr(at)).at("output_ids").get<std::vector<int>>();
}

TEST(ServeFlags, AMisspelledFlagFailsNamingTheClosestOne) {
  expect_refused(fmt::format("serve {} --enable-chunk-prefill", kTiny),
                 "unknown option '--enable-chunk-prefill' for 'm3serve serve'; did you mean '--enable-chunked-prefill'?");
  expect_refused(fmt::format("serve {} --atention-backend=FLASHINFER", kTiny), "did you mean '--attention-backend'?");
  expect_refused(fmt::format("serve {} --no-enable-prefix-cachin", kTiny), "did you mean '--no-enable-prefix-caching'?");
  expect_refused(generate(kTiny, "--max-model-lenn 64"), "for 'm3serve generate'; did you mean '--max-model-len'?");
  expect_refused(fmt::format("bench latency --model {} --enforce-eagr", kTiny),
                 "for 'm3serve bench latency'; did you mean '--enforce-eager'?");
  const Result far = run_m3serve(fmt::format("serve {} --frobnicate", kTiny));
  EXPECT_NE(far.status, 0);
  EXPECT_TRUE(has(far.out, "--frobnicate")) << far.out;
  EXPECT_FALSE(has(far.out, "did you mean")) << far.out;  // nothing is close: no guess
}

TEST(ServeFlags, QuantizationMustMatchTheCheckpoint) {
  EXPECT_EQ(run_m3serve(generate(kSmall, "--quantization mxfp8", 1)).status, 0);
  expect_refused(generate(kSmall, "--quantization fp8"),
                 "--quantization fp8 does not match models/minimax-m3-small: its quantization_config says "
                 "quant_method 'mxfp8' (pass 'mxfp8' or drop --quantization)");
  expect_refused(generate(kSmall, "-q compressed-tensors"), "quant_method 'mxfp8'");
  expect_refused(generate(kTiny, "--quantization fp8"),
                 "--quantization fp8: models/minimax-m3-tiny is not quantized (its config.json has no "
                 "quantization_config)");
}

TEST(ServeFlags, WithoutChunkedPrefillTheStepMustHoldTheLongestPrompt) {
  expect_refused(generate(kTiny, "--no-enable-chunked-prefill --max-model-len 1024 --max-num-batched-tokens 512"),
                 "--max-num-batched-tokens 512 is smaller than the max model length 1024 with "
                 "--no-enable-chunked-prefill");
  // Unset, the budget is vLLM's default for this case, max(max-model-len, 2048); the tokens are
  // those of a chunked run (a prompt's logits do not depend on how it was cut).
  const std::vector<int> chunked = output_ids("--max-model-len 4096 --max-num-seqs 1 --max-num-batched-tokens 3");
  ASSERT_EQ(chunked.size(), 12u);
  EXPECT_EQ(output_ids("--max-model-len 4096 --no-enable-chunked-prefill"), chunked);
  EXPECT_EQ(output_ids("--max-model-len 4096 --enable-chunked-prefill"), chunked);
}

TEST(ServeFlags, SeedMakesUnseededSamplingReproducible) {
  const std::string sampled = "--temperature 1.0 --ignore-eos ";
  const std::vector<int> a = output_ids(sampled + "--seed 11");
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(output_ids(sampled + "--seed 11"), a);
  EXPECT_NE(output_ids(sampled + "--seed 12"), a);
  EXPECT_EQ(output_ids(sampled), output_ids(sampled + "--seed 0"));  // vLLM's default seed, 0
  // A request's own seed is its own, whatever --seed says.
  EXPECT_EQ(output_ids(sampled + "--seed 11 --sample-seed 5"), output_ids(sampled + "--seed 12 --sample-seed 5"));
}

// Starts `serve` with `args`, waits for it to be ready, stops it with SIGTERM; returns its log.
Result serve_until_ready(const std::string& args) {
  const std::string command = fmt::format("sh -c 'echo pid $$; exec {} serve {} --host 127.0.0.1 --port 0 {}' 2>&1",
                                          M3SERVE_BIN, kTiny, args);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "cannot run " + command};
  Result r;
  std::array<char, 4096> line;
  long pid = -1;
  while (fgets(line.data(), line.size(), pipe) != nullptr) {
    r.out += line.data();
    if (pid < 0 && std::sscanf(line.data(), "pid %ld", &pid) == 1) continue;
    if (has(line.data(), "ready: serving") && pid > 0) kill(static_cast<pid_t>(pid), SIGTERM);
  }
  r.status = pclose(pipe);
  return r;
}

TEST(ServeFlags, VllmFlagsWithoutACounterpartAreAcceptedWithOneLogLine) {
  const Result r = serve_until_ready(
      "--attention-backend FLASHINFER --disable-hybrid-kv-cache-manager --trust-remote-code --uvicorn-log-level "
      "warning --disable-uvicorn-access-log --disable-log-requests --enable-log-requests --max-log-len 100 "
      "--swap-space 4 --disable-custom-all-reduce --enable-prompt-tokens-details --enable-chunked-prefill "
      "--max-num-batched-tokens 4096 --served-model-name a b --disable-log-stats");
  EXPECT_EQ(r.status, 0) << r.out;
  for (const std::string line :
       {"--attention-backend FLASHINFER: m3serve has one attention implementation per device",
        "--disable-hybrid-kv-cache-manager: m3serve has one KV manager",
        "--trust-remote-code: no remote code is ever run", "--uvicorn-log-level warning: there is no uvicorn",
        "--disable-uvicorn-access-log: there is no uvicorn", "--disable-log-requests: requests are not logged",
        "--enable-log-requests: m3serve has no per-request log", "--max-log-len 100: prompts are not logged",
        "--swap-space 4: there is no CPU swap space", "--disable-custom-all-reduce: m3serve has no custom all-reduce",
        "ready: serving 'a'"}) {
    EXPECT_TRUE(has(r.out, line)) << line << "\n" << r.out;
  }
}

}  // namespace
