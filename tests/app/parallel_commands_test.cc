// The parallel options as a user gives them, end to end through the m3serve binary on the CPU:
// `generate` on the tiny model with -tp 2 / 4, expert parallel, indexer decode CP, DEP 2 / 4 and
// DEP 2 x -tp 2 gives one rank's greedy ids (and --batch-invariant changes none on the CPU), and
// layouts that cannot run give an error naming what is wrong (before any weight is read).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

constexpr const char* kTiny = "models/minimax-m3-tiny";

struct Run {
  int status = 0;
  std::string out;  // stdout and stderr
};

Run run_m3serve(const std::string& args) {
  const std::string command = fmt::format("{} {} 2>&1", M3SERVE_BIN, args);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "cannot run " + command};
  Run r;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) r.out.append(buffer.data(), n);
  r.status = pclose(pipe);
  return r;
}

// The output ids of a greedy `generate --json` run (its JSON is the last line).
std::vector<int> generate_ids(const std::string& layout, const std::string& prompt, const char* model = kTiny) {
  const Run r = run_m3serve(fmt::format("generate --model {} --device cpu --dtype float32 --max-tokens 24 --json "
                                        "--prompt-ids {} {}",
                                        model, prompt, layout));
  EXPECT_EQ(r.status, 0) << layout << "\n" << r.out;
  const size_t line = r.out.rfind("\n{\"");  // the last line that opens an object (a nested one does not)
  const size_t at = line == std::string::npos ? r.out.rfind("{\"") : line + 1;
  if (at == std::string::npos) {
    ADD_FAILURE() << layout << ": no JSON in\n" << r.out;
    return {};
  }
  return nlohmann::json::parse(r.out.substr(at)).at("output_ids").get<std::vector<int>>();
}

TEST(ParallelCommands, GenerateGivesOneRanksTokensUnderEveryLayout) {
  for (const std::string prompt : {"1,2,3,4,5,6,7,8,9,10,11", "400,20,3000,5,77,123,4096,8000,1,1,2,3,5,8,13,21,34,55"}) {
    const std::vector<int> one = generate_ids("", prompt);
    ASSERT_EQ(one.size(), 24u);
    for (const std::string layout : {"-tp 2", "-tp 4", "-tp 2 --enable-expert-parallel",
                                     "--tensor-parallel-size 4 --enable-expert-parallel",
                                     "-tp 2 --attention-config '{\"indexer_decode_cp\": true}'",
                                     "--data-parallel-size 2 --enable-expert-parallel",
                                     "--data-parallel-size 4 --enable-expert-parallel",
                                     "-tp 2 --data-parallel-size 2 --enable-expert-parallel"})
      EXPECT_EQ(generate_ids(layout, prompt), one) << layout << " on prompt " << prompt;
  }
}

// The DSpark drafter beside tensor-parallel ranks (it reads rank 0's taps, the whole residual
// stream) and one per data-parallel copy: the bundled model's text under -tp 2, expert parallel
// and DEP 2, with and without it.
TEST(ParallelCommands, DSparkDrafterBesideTensorParallelRanks) {
  const char* small = "models/minimax-m3-small";
  const std::string prompt = "650,444,566,371,284,258,384,864,777,936,296,335,259,323,2356,272,4523,258,384";
  const std::vector<int> one = generate_ids("--ignore-eos", prompt, small);
  ASSERT_EQ(one.size(), 24u);
  const std::string spec = "--ignore-eos --speculative-config '{\"method\": \"dspark\", \"num_speculative_tokens\": 7}'";
  for (const std::string layout : {"", "-tp 2", "-tp 2 --enable-expert-parallel",
                                   "--data-parallel-size 2 --enable-expert-parallel"})
    EXPECT_EQ(generate_ids(layout + " " + spec, prompt, small), one) << layout;
}

// --load-format dummy: each rank builds only its own slices (model/dummy_shard.h), the same bytes
// as cutting the whole dummy model, so every layout still gives one rank's ids.
TEST(ParallelCommands, DummyWeightsBuiltPerRankGiveOneRanksTokens) {
  const std::string prompt = "9,8,7,6,5,4,3,2,1";
  const std::vector<int> one = generate_ids("--load-format dummy --seed 3", prompt);
  ASSERT_EQ(one.size(), 24u);
  for (const std::string layout : {"-tp 2", "-tp 4 --enable-expert-parallel",
                                   "--data-parallel-size 2 --enable-expert-parallel",
                                   "-tp 2 --data-parallel-size 2 --enable-expert-parallel"})
    EXPECT_EQ(generate_ids("--load-format dummy --seed 3 " + layout, prompt), one) << layout;
}

// The CPU backend is batch-invariant whatever the flags: --batch-invariant is accepted and changes
// nothing there.
TEST(ParallelCommands, BatchInvariantIsANoOpOnTheCpu) {
  const std::string prompt = "5,6,7,8,9,10,11,12";
  const std::vector<int> plain = generate_ids("", prompt);
  ASSERT_EQ(plain.size(), 24u);
  EXPECT_EQ(generate_ids("--batch-invariant", prompt), plain);
}

void expect_refused(const std::string& args, const std::string& message) {
  const Run r = run_m3serve(args);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
}

TEST(ParallelCommands, LayoutsThatCannotRunAreRefusedNamingTheProblem) {
  const std::string gen = fmt::format("generate --model {} --device cpu --prompt-ids 1,2,3 ", kTiny);
  // The tiny model has 4 query heads, 2 KV heads and 8 experts.
  expect_refused(gen + "-tp 3", "-tp 3: num_attention_heads 4 is not a multiple of 3");
  expect_refused(gen + "-tp 16 --enable-expert-parallel", "-tp 16: num_attention_heads 4 is not a multiple of 16");
  expect_refused(gen + "--nnodes 2", "give --master-addr");
  expect_refused(gen + "--nnodes 2 --node-rank 2 --master-addr 10.0.0.1", "--node-rank 2 outside [0, --nnodes 2)");
  expect_refused(gen + "--data-parallel-size 2", "data-parallel copies run as DEP");
  expect_refused(gen + "-tp 3 --data-parallel-size 2 --enable-expert-parallel",
                 "-tp 3 (the ranks of each of the --data-parallel-size 2 copies): num_attention_heads 4 is not a "
                 "multiple of 3");
  expect_refused(gen + "-tp 2 --data-parallel-size 8 --enable-expert-parallel",
                 "EP size 16 (-tp 2 x --data-parallel-size 8) is more ranks than num_local_experts 8");
  expect_refused(fmt::format("bench latency --model {} --device cpu --data-parallel-size 2 --enable-expert-parallel "
                             "--batch-sizes 1 --context-lens 16",
                             kTiny),
                 "data-parallel copies run through the engine");
  expect_refused(gen + "--attention-config '{\"indexer_decode_cp\": true}'", "and -tp is 1");
  // --batch-invariant: one rank (the all-reduce's order is not fixed).
  expect_refused(gen + "-tp 2 --batch-invariant", "--batch-invariant runs the model on one rank");
  expect_refused(gen + "--data-parallel-size 2 --enable-expert-parallel --batch-invariant",
                 "--batch-invariant runs the model on one rank; it does not go with -tp 1 / --data-parallel-size 2");
  expect_refused(fmt::format("serve --model {} --device cpu -tp 3", kTiny), "num_attention_heads 4 is not a multiple of 3");
}

}  // namespace
