// `m3serve bench latency` and `m3serve bench throughput` on the tiny model (its checkpoint and
// dummy weights of its config), small sizes, --json: the report has its fields, times are
// positive, and the byte floor is the one its definition gives (checked against numbers worked
// out by hand from models/minimax-m3-tiny/config.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

constexpr const char* kTiny = "models/minimax-m3-tiny";

// Runs `command` through the shell; returns its exit status and what it wrote to the pipe.
std::pair<int, std::string> run_shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return {-1, {}};
  }
  std::string out;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) out.append(buffer.data(), n);
  return {pclose(pipe), out};
}

// Runs m3serve with `args`; returns its stdout parsed as JSON (fails the test on exit status != 0).
json run_m3serve(const std::string& args) {
  const std::string command = fmt::format("{} {} 2>/dev/null", M3SERVE_BIN, args);
  const auto [status, out] = run_shell(command);
  EXPECT_EQ(status, 0) << command << "\n" << out;
  try {
    return json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << command << ": output is not JSON (" << e.what() << "):\n" << out;
    return {};
  }
}

const json& decode_case(const json& report, int batch, int context) {
  for (const json& c : report.at("decode"))
    if (c.at("batch") == batch && c.at("context") == context) return c;
  static const json none;
  ADD_FAILURE() << "no decode case batch " << batch << " context " << context;
  return none;
}

void expect_timed_decode(const json& c) {
  ASSERT_EQ(c.at("status"), "ok");
  EXPECT_GT(c.at("step_ms").get<double>(), 0.0);
  EXPECT_GT(c.at("per_layer_us").get<double>(), 0.0);
  EXPECT_GT(c.at("tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(c.at("achieved_bytes_per_s").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(c.at("floor_bytes").get<double>(),
                   c.at("weight_bytes").get<double>() + c.at("kv_bytes").get<double>());
}

TEST(BenchLatency, TinyCheckpointReportsDecodeAndPrefillAgainstTheirFloors) {
  const json r = run_m3serve(fmt::format(
      "bench latency --model {} --device cpu --batch-sizes 1,4 --context-lens 256 --prefill-lens 512 "
      "--chunk-size 256 --warmup 1 --iters 2 --bandwidth 1e11 --flops 1e12 --spec-tokens 3 --json", kTiny));
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("device"), "cpu");
  EXPECT_EQ(r.at("num_layers"), 4);
  const json& b1 = decode_case(r, 1, 256);
  const json& b4 = decode_case(r, 4, 256);
  expect_timed_decode(b1);
  expect_timed_decode(b4);
  // 8 experts, top-2: a batch of 4 touches 8 (1 - 0.75^4) = 5.47 experts per MoE layer, one 2.
  const json& w = r.at("weights");
  EXPECT_EQ(w.at("moe_layers"), 3);
  const double expected_extra = 3 * (8 * (1 - std::pow(0.75, 4)) - 2) * w.at("expert_bytes").get<double>() +
                                3 * w.at("embed_row_bytes").get<double>();
  EXPECT_NEAR(b4.at("weight_bytes").get<double>() - b1.at("weight_bytes").get<double>(), expected_extra, 1.0);
  // bf16 KV, 4 sparse layers, context 256 < 16 top-k blocks x 128: index-K 128 B + K,V of 2 heads
  // 2 x 2 x 128 B per token and layer.
  EXPECT_DOUBLE_EQ(b1.at("kv_bytes").get<double>(), 4 * 256 * (128 + 512));
  EXPECT_DOUBLE_EQ(b4.at("kv_bytes").get<double>(), 4 * b1.at("kv_bytes").get<double>());
  EXPECT_NEAR(b1.at("floor_ratio").get<double>(),
              b1.at("step_ms").get<double>() / (b1.at("floor_bytes").get<double>() / 1e11 * 1e3), 1e-9);
  // A verification step of 1 + 3 tokens a request touches the experts of 4 tokens (batch 1: the
  // decode step of batch 4's weights) and, at a context within one selection, the same KV.
  ASSERT_EQ(b1.at("verification").size(), 1u);
  const json& v = b1.at("verification")[0];
  EXPECT_EQ(v.at("k"), 3);
  EXPECT_EQ(v.at("tokens"), 4);
  EXPECT_DOUBLE_EQ(v.at("weight_bytes").get<double>(), b4.at("weight_bytes").get<double>());
  EXPECT_DOUBLE_EQ(v.at("kv_bytes_shared_selection").get<double>(), b1.at("kv_bytes").get<double>());
  EXPECT_DOUBLE_EQ(v.at("kv_bytes_distinct_selection").get<double>(), b1.at("kv_bytes").get<double>());
  EXPECT_DOUBLE_EQ(v.at("breakeven_acceptance_length").get<double>(),
                   v.at("floor_bytes").get<double>() / b1.at("floor_bytes").get<double>());
  EXPECT_GT(v.at("breakeven_acceptance_length").get<double>(), 1.0);
  // The per-op breakdown covers the graph's ops.
  for (const char* op : {"moe", "swiglu_mlp", "paged_attention", "indexer_topk", "linear lm_head", "plan"})
    EXPECT_TRUE(b1.at("ops_ms").contains(op)) << op;
  // Each op's own byte floor (app/op_floors.h): together they cover the step's floor (every weight
  // touched and the KV read once) plus the activations between ops; the KV ops read the step
  // floor's KV, lm_head its weight.
  for (const json* c : {&b1, &b4}) {
    const json& bytes = c->at("ops_bytes");
    double sum = 0;
    for (const auto& [name, b] : bytes.items()) sum += b.get<double>();
    EXPECT_GE(sum, c->at("floor_bytes").get<double>());
    EXPECT_LT(sum, 1.5 * c->at("floor_bytes").get<double>());
    EXPECT_GE(bytes.at("paged_attention").get<double>() + bytes.at("indexer_topk").get<double>(),
              c->at("kv_bytes").get<double>());
    EXPECT_GE(bytes.at("linear lm_head").get<double>(), w.at("lm_head_bytes").get<double>());
    EXPECT_DOUBLE_EQ(c->at("ops_calls").at("moe").get<double>(), 3.0);  // one a MoE layer a step
    // x floor = (time less one wait a call) / (bytes / --bandwidth).
    const double moe_ms = c->at("ops_ms").at("moe").get<double>();
    const double busy_ms = std::max(0.0, moe_ms - 3.0 * c->at("op_sync_ms").get<double>());
    EXPECT_NEAR(c->at("ops_floor_ratio").at("moe").get<double>(), busy_ms / (bytes.at("moe").get<double>() / 1e11 * 1e3),
                1e-6);
  }
  // The experts a batch of 4 touches: 5.47 of 8 a MoE layer against 2 (as the step floor).
  EXPECT_NEAR(b4.at("ops_bytes").at("moe").get<double>() - b1.at("ops_bytes").at("moe").get<double>(),
              3 * (8 * (1 - std::pow(0.75, 4)) - 2) * w.at("expert_bytes").get<double>() +
                  3 * 3 * 256 * 2 * 4.0,  // x and out of 3 more rows a layer: hidden 256, f32 on the CPU
              1.0);

  ASSERT_EQ(r.at("prefill").size(), 1u);
  const json& p = r.at("prefill")[0];
  ASSERT_EQ(p.at("status"), "ok");
  EXPECT_EQ(p.at("prompt_len"), 512);
  EXPECT_GT(p.at("time_ms").get<double>(), 0.0);
  EXPECT_NEAR(p.at("tokens_per_s").get<double>(), 512 / (p.at("time_ms").get<double>() / 1e3), 1e-6);
  // At least 2 x active params per token; the attention terms add more.
  EXPECT_GT(p.at("flops").get<double>(), 2.0 * 512 * w.at("active_params_per_token").get<double>());
  EXPECT_GT(p.at("floor_ratio").get<double>(), 0.0);
  // The ops' FLOPs (app/op_floors.h) add up to the prompt's FLOP floor, chunk by chunk, and each
  // op's ratio is its time less one wait a call over its FLOPs at --flops.
  double op_flops = 0;
  for (const auto& [name, f] : p.at("ops_flops").items()) op_flops += f.get<double>();
  EXPECT_NEAR(op_flops, p.at("flops").get<double>(), 1e-9 * p.at("flops").get<double>());
  for (const char* op : {"moe", "paged_attention", "indexer_topk", "linears q_proj", "linear lm_head"}) {
    ASSERT_TRUE(p.at("ops_flops").contains(op)) << op;
    const double f = p.at("ops_flops").at(op).get<double>();
    EXPECT_NEAR(p.at("ops_flop_floor_ratio").at(op).get<double>() * f / 1e12,
                p.at("ops_flops").at(op).get<double>() / p.at("ops_flops_per_s").at(op).get<double>(), 1e-9)
        << op;
  }
}

TEST(BenchLatency, DummyOneDenseLayerTouchesTheSameWeightsAtEveryBatch) {
  const json r = run_m3serve(fmt::format(
      "bench latency --model {} --load-format dummy --num-layers 1 --device cpu --batch-sizes 1,4 "
      "--context-lens 256 --prefill-lens 512 --warmup 1 --iters 2 --no-op-breakdown --json", kTiny));
  ASSERT_TRUE(r.is_object());
  const json& w = r.at("weights");
  EXPECT_EQ(w.at("moe_layers"), 0);
  // bf16 linears of layer 0 (q 256x256, k, v 128x256, o 256x256, index q 128x256, k 64x256, dense
  // MLP 3 x 128x256) + f32 norms (2 x 256, 4 x 64) + final norm 256.
  EXPECT_DOUBLE_EQ(w.at("always_bytes").get<double>(),
                   2.0 * (245760 + 98304) + 4.0 * (2 * 256 + 4 * 64) + 4.0 * 256);
  EXPECT_DOUBLE_EQ(w.at("lm_head_bytes").get<double>(), 2.0 * 8192 * 256);
  const json& b1 = decode_case(r, 1, 256);
  const json& b4 = decode_case(r, 4, 256);
  expect_timed_decode(b1);
  expect_timed_decode(b4);
  EXPECT_FALSE(b1.contains("ops_ms"));
  // No --bandwidth on the CPU: the floor is at this machine's copy rate, measured at start.
  EXPECT_GT(r.at("bandwidth_bytes_per_s").get<double>(), 1e8);
  EXPECT_NE(r.at("bandwidth_source").get<std::string>().find("measured copy rate of this machine"), std::string::npos);
  EXPECT_NEAR(b1.at("floor_ratio").get<double>(),
              b1.at("step_ms").get<double>() /
                  (b1.at("floor_bytes").get<double>() / r.at("bandwidth_bytes_per_s").get<double>() * 1e3),
              1e-9);
  // No MoE: only the embedding rows differ.
  EXPECT_DOUBLE_EQ(b4.at("weight_bytes").get<double>() - b1.at("weight_bytes").get<double>(),
                   3 * w.at("embed_row_bytes").get<double>());
  EXPECT_EQ(r.at("prefill")[0].at("status"), "ok");
}

TEST(BenchLatency, SampledDecodeWithLogprobsRecordsItsSamplingAndTimesTheSampleOp) {
  const json r = run_m3serve(fmt::format(
      "bench latency --model {} --load-format dummy --num-layers 1 --device cpu --batch-sizes 3 --context-lens 256 "
      "--prefill-lens '' --warmup 1 --iters 1 --temperature 0.8 --top-k 50 --top-p 0.95 --logprobs 5 --json",
      kTiny));
  ASSERT_TRUE(r.is_object());
  const json& s = r.at("sampling");
  EXPECT_FLOAT_EQ(s.at("temperature").get<float>(), 0.8f);
  EXPECT_EQ(s.at("top_k"), 50);
  EXPECT_FLOAT_EQ(s.at("top_p").get<float>(), 0.95f);
  EXPECT_EQ(s.at("logprobs"), 5);
  const json& b3 = decode_case(r, 3, 256);
  expect_timed_decode(b3);
  EXPECT_DOUBLE_EQ(b3.at("ops_calls").at("sample").get<double>(), 1.0);  // the draw and the logprobs: one op
  EXPECT_GT(b3.at("ops_ms").at("sample").get<double>(), 0.0);
  EXPECT_TRUE(r.at("prefill").empty());
  // Greedy and no logprobs unless asked.
  const json greedy = run_m3serve(fmt::format(
      "bench latency --model {} --load-format dummy --num-layers 1 --device cpu --batch-sizes 1 --context-lens 256 "
      "--prefill-lens '' --warmup 0 --iters 1 --no-op-breakdown --json",
      kTiny));
  ASSERT_TRUE(greedy.is_object());
  EXPECT_EQ(greedy.at("sampling").at("temperature").get<double>(), 0.0);
  EXPECT_EQ(greedy.at("sampling").at("logprobs"), -1);
}

TEST(BenchLatency, CasesWhosePoolExceedsTheBudgetAreSkipped) {
  // 2560 B per token across 4 layers: --kv-cache-memory 1MiB is a pool of 3 blocks of 128 tokens.
  const json r = run_m3serve(fmt::format(
      "bench latency --model {} --load-format dummy --device cpu --kv-cache-memory 1MiB --batch-sizes 1,4 "
      "--context-lens 256 --prefill-lens 512 --warmup 0 --iters 1 --no-op-breakdown --json", kTiny));
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("kv_pool_blocks"), 3);
  expect_timed_decode(decode_case(r, 1, 256));
  EXPECT_EQ(decode_case(r, 4, 256).at("status"), "skipped: pool too large");
  EXPECT_EQ(r.at("prefill")[0].at("status"), "skipped: pool too large");
}

// Runs m3serve with `args`, expecting it to fail: returns its stderr.
std::string run_m3serve_failing(const std::string& args) {
  const std::string command = fmt::format("{} {} 2>&1 >/dev/null", M3SERVE_BIN, args);
  const auto [status, err] = run_shell(command);
  EXPECT_NE(status, 0) << command << " succeeded";
  return err;
}

TEST(BenchLatency, KernelTimelineIsRefusedOffTheGpuBeforeAnyWork) {
  // The CPU runs no GPU kernels to record: a clear error, not an empty timeline.
  const std::string err = run_m3serve_failing(fmt::format(
      "bench latency --model {} --load-format dummy --device cpu --batch-sizes 1 --context-lens 256 "
      "--prefill-lens '' --kernel-timeline --json", kTiny));
  EXPECT_NE(err.find("--kernel-timeline"), std::string::npos) << err;
  EXPECT_NE(err.find("--device cuda"), std::string::npos) << err;
  // Without the flag the report says so.
  const json r = run_m3serve(fmt::format(
      "bench latency --model {} --load-format dummy --device cpu --batch-sizes 1 --context-lens 256 "
      "--prefill-lens '' --warmup 0 --iters 1 --no-op-breakdown --json", kTiny));
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("kernel_timeline"), false);
  EXPECT_FALSE(decode_case(r, 1, 256).contains("kernel_timeline"));
}

void expect_throughput(const json& r, int prompts, int input_len, int output_len) {
  ASSERT_TRUE(r.is_object());
  EXPECT_EQ(r.at("num_requests"), prompts);
  EXPECT_EQ(r.at("failed"), 0);
  EXPECT_EQ(r.at("total_input_tokens"), prompts * input_len);
  EXPECT_EQ(r.at("total_output_tokens"), prompts * output_len);
  const double elapsed = r.at("elapsed_time").get<double>();
  ASSERT_GT(elapsed, 0.0);
  EXPECT_NEAR(r.at("requests_per_second").get<double>(), prompts / elapsed, 1e-9);
  EXPECT_NEAR(r.at("tokens_per_second").get<double>(), prompts * (input_len + output_len) / elapsed, 1e-6);
  EXPECT_NEAR(r.at("output_tokens_per_second").get<double>(), prompts * output_len / elapsed, 1e-6);
  EXPECT_GE(r.at("num_steps").get<int>(), output_len);
}

TEST(BenchThroughput, TinyCheckpointRunsEveryRequestToItsOutputLength) {
  expect_throughput(run_m3serve(fmt::format("bench throughput --model {} --device cpu --num-prompts 6 "
                                            "--input-len 40 --output-len 8 --json", kTiny)),
                    6, 40, 8);
}

TEST(BenchThroughput, DummyOneLayerWithFewerSeqsThanPrompts) {
  expect_throughput(run_m3serve(fmt::format("bench throughput --model {} --load-format dummy --num-layers 1 "
                                            "--device cpu --num-prompts 5 --input-len 16 --output-len 6 "
                                            "--max-num-seqs 2 --max-num-batched-tokens 64 --json", kTiny)),
                    5, 16, 6);
}

}  // namespace
