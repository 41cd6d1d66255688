// `m3serve plan` as a user runs it, against figures worked out by hand from the configs in
// bench/configs (docs/reference.md 2.1, 2.6, 4.3, 4.4): the seed's capacity figure (M3.1 with
// NVFP4 KV and index keys on 4 x B300 in DEP4 at 256K tokens: 76 sequences; M3 with FP8 KV: 28),
// a TP4 layout, and the errors of layouts that do not fit.
#include <gtest/gtest.h>

#include <array>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

struct CommandRun {
  int status = -1;
  std::string out;  // stdout and stderr
};

CommandRun run_m3serve(const std::string& args) {
  const std::string command = fmt::format("{} {} 2>&1", M3SERVE_BIN, args);
  CommandRun r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return r;
  }
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) r.out.append(buffer.data(), n);
  r.status = pclose(pipe);
  return r;
}

json plan_json(const std::string& args) {
  const CommandRun r = run_m3serve("plan " + args + " --json");
  EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
  try {
    return json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << args << ": output is not JSON (" << e.what() << "):\n" << r.out;
    return json::object();
  }
}

// DEP4 on 4 x B300 at 256K tokens, 0.95 of 288 GB each.
const std::string kDep4 =
    "--num-gpus 4 --gpu-memory-gb 288 --data-parallel-size 4 --enable-expert-parallel --max-model-len 262144 "
    "--gpu-memory-utilization 0.95";

// Both full-size configs share these per-rank pieces in DEP4 (every rank holds the whole
// attention, dense MLPs, shared experts, embedding and lm_head; H = 6144, vocab 200064):
//  embedding: embed + lm_head bf16 2 x 200064 x 6144 x 2 = 4,916,772,864, final norm 4 x 6144 = 24,576
//             -> 4,916,797,440
//  mxfp8 [out, in] = out x in + out x in / 32 (UE8M0 per 1x32):
//    q [8192, 6144] 51,904,512; k, v [512, 6144] 3,244,032 each; o [6144, 8192] 51,904,512;
//    norms 2 x 4 x 6144 + 2 x 4 x 128 = 50,176 -> full-attention layer 110,347,264;
//    + index_q [512, 6144] 3,244,032, index_k [128, 6144] 811,008, its norms 1,024
//    -> sparse layer 114,403,328
//  dense MLP: gate, up [12288, 6144] and down [6144, 12288], 77,856,768 each -> 3 layers 700,710,912
//  shared expert (gate, up [3072, 6144], down [6144, 3072], 19,464,192 each) + router f32
//    4 x 128 x 6144 + bias 4 x 128 = 3,146,240 -> 61,538,816 x 57 MoE layers = 3,507,712,512
//  activation reserve: 2^30 + 8192 tokens (serve's default on a GPU of 70 GiB or more) x 2 x
//    (4 x 6144 + 2 x 64 x 128 + 2 x 4 x 128 + 5 x 128 + 12288 + 4 x (3072 + 6144) + 2 x 128)
//    = 8192 x 184,064 = 1,507,852,288, + 64 rows x (200064 x 6 + 2 x 6144) = 77,611,008
//    -> 2,659,205,120 on one copy. Under DEP D a rank's MoE runs over D x 8192 rows: the other
//    copies' (D - 1) x 8192 x 2 x (4 x (3072 + 6144) + 2 x 128) = (D - 1) x 608,174,080, and the
//    gathered, returned and own rows (2 D + 1) x 8192 x 2 x 6144 = (2 D + 1) x 100,663,296;
//    D 4: + 1,824,522,240 + 905,969,664 -> 5,389,697,024.
//  budget 0.95 x 288e9 = 273,600,000,000; a 262,144-token sequence is 2048 blocks of 128.
TEST(PlanCommand, M31Dep4NvFp4HoldsSeventySixSequences) {
  const json p = plan_json("bench/configs/minimax-m3.1 " + kDep4 +
                           " --kv-cache-dtype nvfp4 --attention-config '{\"indexer_kv_dtype\": \"nvfp4\"}'");
  // Routed experts nvfp4 (codes out x in / 2 + E4M3 scales out x in / 16): w1, w3 [3072, 6144]
  // and w2 [6144, 3072] 10,616,832 each; 128 / 4 = 32 experts x 57 layers x 31,850,496
  // = 58,095,304,704. Attention: 60 sparse layers x 114,403,328 = 6,864,199,680.
  // Total 4,916,797,440 + 6,864,199,680 + 700,710,912 + 3,507,712,512 + 58,095,304,704.
  EXPECT_EQ(p.at("weights_per_rank").at("routed_experts"), 58095304704);
  EXPECT_EQ(p.at("weights_per_rank").at("attention"), 6864199680);
  EXPECT_EQ(p.at("weights_per_rank_bytes"), 74084725248);
  // nvfp4 row of 128 = 64 + 8 B: K+V 60 x 4 heads x 2 x 72 = 34,560; index-K 60 x 72 = 4,320.
  EXPECT_EQ(p.at("kv_bytes_per_token"), 34560);
  EXPECT_EQ(p.at("index_k_bytes_per_token"), 4320);
  EXPECT_EQ(p.at("kv_total_bytes_per_token"), 38880);
  EXPECT_EQ(p.at("max_num_batched_tokens"), 8192);
  EXPECT_EQ(p.at("activation_reserve_bytes"), 5389697024);
  // 273,600,000,000 - 74,084,725,248 - 5,389,697,024 = 194,125,577,728 B / (128 x 38,880 B) =
  // 39,007 blocks; / 2048 = 19 sequences per rank, x 4 ranks = 76.
  EXPECT_EQ(p.at("kv_pool_bytes_per_rank"), 194125577728);
  EXPECT_EQ(p.at("kv_blocks_per_rank"), 39007);
  EXPECT_EQ(p.at("sequences_per_data_parallel_rank"), 19);
  EXPECT_EQ(p.at("max_concurrent_sequences"), 76);
  EXPECT_EQ(p.at("expert_parallel_size"), 4);
  EXPECT_EQ(p.at("attention_data_parallel"), true);
  EXPECT_EQ(p.at("rank0").at("experts"), 32);
  EXPECT_EQ(p.at("rank0").at("q_heads"), 64);
}

TEST(PlanCommand, M3Dep4Fp8KvHoldsTwentyEightSequences) {
  // The figure's M3 case sets only the KV dtype: the index keys stay bf16 (vLLM's
  // --kv-cache-dtype leaves the index cache alone, which is why the M3.1 line sets
  // indexer_kv_dtype); m3serve's default index dtype is the KV dtype, so it is given here.
  const json p = plan_json("bench/configs/minimax-m3 " + kDep4 +
                           " --kv-cache-dtype fp8 --attention-config '{\"indexer_kv_dtype\": \"bfloat16\"}'");
  // Routed experts mxfp8: w1, w3, w2 19,464,192 each -> 32 x 57 x 58,392,576 = 106,508,058,624.
  // Attention: 3 full layers x 110,347,264 + 57 sparse x 114,403,328 = 6,852,031,488.
  // Total 4,916,797,440 + 6,852,031,488 + 700,710,912 + 3,507,712,512 + 106,508,058,624.
  EXPECT_EQ(p.at("weights_per_rank_bytes"), 122485310976);
  // fp8 K+V 60 x 4 x 2 x 128 = 61,440; bf16 index-K on the 57 sparse layers 57 x 256 = 14,592.
  EXPECT_EQ(p.at("kv_bytes_per_token"), 61440);
  EXPECT_EQ(p.at("index_k_bytes_per_token"), 14592);
  EXPECT_EQ(p.at("kv_total_bytes_per_token"), 76032);
  // 273,600,000,000 - 122,485,310,976 - 5,389,697,024 (the reserve above) = 145,724,992,000 B /
  // (128 x 76,032 B) = 14,973 blocks; / 2048 = 7 per rank, x 4 = 28.
  EXPECT_EQ(p.at("kv_blocks_per_rank"), 14973);
  EXPECT_EQ(p.at("max_concurrent_sequences"), 28);
  // With fp8 index keys too (57 x 128 = 7,296 B, 68,736 B a token): 145,724,992,000 /
  // (128 x 68,736) = 16,563 blocks = 8 per rank, 32 in all.
  const json fp8_index = plan_json("bench/configs/minimax-m3 " + kDep4 + " --kv-cache-dtype fp8");
  EXPECT_EQ(fp8_index.at("index_k_bytes_per_token"), 7296);
  EXPECT_EQ(fp8_index.at("max_concurrent_sequences"), 32);
}

TEST(PlanCommand, StepBudgetIsServesDefaultForTheGpuMemory) {
  // vLLM serve's rule: 8192 tokens a step on a GPU of at least 70 GiB (75.16 GB), else 2048;
  // the reserve grows by the 6144 tokens' activations (184,064 B each for M3.1, above).
  const std::string m31 = "bench/configs/minimax-m3.1 --num-gpus 8 -tp 8 --kv-cache-dtype nvfp4 ";
  const json h200 = plan_json(m31 + "--gpu-memory-gb 141");
  const json below = plan_json(m31 + "--gpu-memory-gb 75");
  EXPECT_EQ(h200.at("max_num_batched_tokens"), 8192);
  EXPECT_EQ(below.at("max_num_batched_tokens"), 2048);
  EXPECT_EQ(plan_json(m31 + "--gpu-memory-gb 76").at("max_num_batched_tokens"), 8192);
  EXPECT_EQ(h200.at("activation_reserve_bytes").get<int64_t>() - below.at("activation_reserve_bytes").get<int64_t>(),
            int64_t{6144} * 184064);
  // The option wins; without chunking a step holds the longest prompt.
  EXPECT_EQ(plan_json(m31 + "--gpu-memory-gb 141 --max-num-batched-tokens 4096").at("max_num_batched_tokens"), 4096);
  EXPECT_EQ(plan_json(m31 + "--gpu-memory-gb 141 --no-enable-chunked-prefill --max-model-len 32768")
                .at("max_num_batched_tokens"),
            32768);
  EXPECT_EQ(plan_json(m31 + "--gpu-memory-gb 48 --no-enable-chunked-prefill --max-model-len 1024")
                .at("max_num_batched_tokens"),
            2048);
}

TEST(PlanCommand, Tp4OnH200SplitsHeadsAndVocab) {
  // -tp 4: 16 query heads, 1 KV head and 1 index head per rank; the vocabulary 200064 = 4 x 50016.
  const json p = plan_json(
      "bench/configs/minimax-m3.1 --num-gpus 4 --gpu-memory-gb 141 -tp 4 --kv-cache-dtype nvfp4 "
      "--max-model-len 131072");
  EXPECT_EQ(p.at("rank0").at("q_heads"), 16);
  EXPECT_EQ(p.at("rank0").at("kv_heads"), 1);
  EXPECT_EQ(p.at("rank0").at("index_heads"), 1);
  EXPECT_EQ(p.at("rank0").at("vocab_rows"), 50016);
  EXPECT_EQ(p.at("rank0").at("expert_intermediate"), 768);
  // One KV head: K+V 60 x 1 x 2 x 72 = 8,640; the index key is one head every rank keeps: 4,320.
  EXPECT_EQ(p.at("kv_bytes_per_token"), 8640);
  EXPECT_EQ(p.at("index_k_bytes_per_token"), 4320);
  // embedding: 2 x 50016 x 6144 x 2 + 24,576 = 1,229,217,792.
  EXPECT_EQ(p.at("weights_per_rank").at("embedding"), 1229217792);
}

TEST(PlanCommand, Dep2OfTp4CopiesSplitsAttentionPerCopyAndExpertsOverEveryRank) {
  // DEP 2 x -tp 4 on 8 x H200: a rank holds what a -tp 4 rank holds of the attention, dense MLPs,
  // shared experts and vocabulary, and 128 / 8 = 16 whole routed experts; each copy's KV heads are
  // split over its 4 ranks, and the two copies' sequences add up.
  const std::string common =
      "bench/configs/minimax-m3.1 --gpu-memory-gb 141 --kv-cache-dtype nvfp4 --attention-config "
      "'{\"indexer_kv_dtype\": \"nvfp4\"}' --max-model-len 131072 --enable-expert-parallel -tp 4";
  const json dep = plan_json(common + " --num-gpus 8 --data-parallel-size 2");
  const json tp4 = plan_json(common + " --num-gpus 4");
  EXPECT_EQ(dep.at("expert_parallel_size"), 8);
  EXPECT_EQ(dep.at("attention_data_parallel"), true);
  EXPECT_EQ(dep.at("rank0").at("q_heads"), 16);
  EXPECT_EQ(dep.at("rank0").at("kv_heads"), 1);
  EXPECT_EQ(dep.at("rank0").at("experts"), 16);
  EXPECT_EQ(dep.at("rank0").at("vocab_rows"), 50016);
  // K+V 60 x 1 x 2 x 72 = 8,640 + index-K 4,320, as -tp 4.
  EXPECT_EQ(dep.at("kv_total_bytes_per_token"), 12960);
  for (const char* part : {"embedding", "attention", "dense_mlp", "shared_expert_and_router"})
    EXPECT_EQ(dep.at("weights_per_rank").at(part), tp4.at("weights_per_rank").at(part)) << part;
  // nvfp4 experts of 31,850,496 B: 16 x 57 layers, half of EP 4's 32.
  EXPECT_EQ(dep.at("weights_per_rank").at("routed_experts"), int64_t{16} * 57 * 31850496);
  EXPECT_EQ(tp4.at("weights_per_rank").at("routed_experts"), int64_t{32} * 57 * 31850496);
  EXPECT_EQ(dep.at("max_concurrent_sequences"), 2 * dep.at("sequences_per_data_parallel_rank").get<int64_t>());
  EXPECT_GT(dep.at("sequences_per_data_parallel_rank").get<int64_t>(),
            tp4.at("sequences_per_data_parallel_rank").get<int64_t>());  // lighter experts leave more room
}

TEST(PlanCommand, VocabularyPadsToAMultipleOfTheRanks) {
  // The tiny model (4 query heads, 2 KV heads, experts of width 32) with an odd vocabulary of 8191:
  // -tp 4 pads it to 8192 = 4 x 2048 rows per rank and replicates each KV head on 2 ranks.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("m3_plan_vocab_{}", getpid());
  std::filesystem::create_directories(dir);
  json config = json::parse(std::ifstream("models/minimax-m3-tiny/config.json"));
  config["vocab_size"] = 8191;
  std::ofstream(dir / "config.json") << config.dump();
  const json p = plan_json(dir.string() + " --num-gpus 4 --gpu-memory-gb 1 -tp 4");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(p.at("padded_vocab_size"), 8192);
  EXPECT_EQ(p.at("rank0").at("vocab_rows"), 2048);
  EXPECT_EQ(p.at("kv_head_replicas"), 2);
  // embed + lm_head bf16 2 x 2048 x 256 x 2 + final norm 4 x 256: the padded rows count.
  EXPECT_EQ(p.at("weights_per_rank").at("embedding"), 2 * 2048 * 256 * 2 + 4 * 256);
}

TEST(PlanCommand, BadLayoutsFailNamingTheDimension) {
  const CommandRun tp3 = run_m3serve("plan bench/configs/minimax-m3.1 --num-gpus 3 --gpu-memory-gb 141 -tp 3");
  EXPECT_NE(tp3.status, 0);
  EXPECT_NE(tp3.out.find("-tp 3: num_attention_heads 64 is not a multiple of 3"), std::string::npos) << tp3.out;
  const CommandRun many = run_m3serve(
      "plan models/minimax-m3-tiny --num-gpus 16 --gpu-memory-gb 1 -tp 2 --data-parallel-size 8 "
      "--enable-expert-parallel");
  EXPECT_NE(many.status, 0);
  EXPECT_NE(many.out.find("EP size 16 (-tp 2 x --data-parallel-size 8) is more ranks than num_local_experts 8"),
            std::string::npos)
      << many.out;
  // -tp 64 divides every dimension, but the shared expert's 3072 columns of down_proj become 48
  // per rank: one and a half 1x32 MXFP8 scale blocks.
  const CommandRun tp64 = run_m3serve("plan bench/configs/minimax-m3.1 --num-gpus 64 --gpu-memory-gb 141 -tp 64");
  EXPECT_NE(tp64.status, 0);
  EXPECT_NE(tp64.out.find("shared_experts.down_proj: a rank holds 48 of its 3072 input columns, which cuts its mxfp8 "
                          "scale blocks of 32 columns"),
            std::string::npos)
      << tp64.out;
  const CommandRun gpus = run_m3serve("plan models/minimax-m3-tiny --num-gpus 3 --gpu-memory-gb 1 -tp 2");
  EXPECT_NE(gpus.status, 0);
  EXPECT_NE(gpus.out.find("--num-gpus 3: the layout -tp 2 x --data-parallel-size 1 uses 2 GPUs"), std::string::npos)
      << gpus.out;
}

TEST(PlanCommand, TextReportCarriesTheCount) {
  const CommandRun r = run_m3serve("plan bench/configs/minimax-m3.1 " + kDep4 +
                            " --kv-cache-dtype nvfp4 --attention-config '{\"indexer_kv_dtype\": \"nvfp4\"}'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("19 sequences per data-parallel rank x 4 = 76 concurrent sequences"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("K+V 34560 B (nvfp4) + index-K 4320 B (nvfp4) = 38880 B"), std::string::npos) << r.out;
}

// A layout that cannot split the model is told so by the same validation as plan (the tiny model
// has 4 query heads and 8 experts), before any port is bound.
TEST(ServeParallelOptions, LayoutErrorsComeBeforeAnyPortIsBound) {
  const CommandRun tp3 = run_m3serve("serve models/minimax-m3-tiny -tp 3 --port 0");
  EXPECT_EQ(WEXITSTATUS(tp3.status), 1) << tp3.out;
  EXPECT_NE(tp3.out.find("-tp 3: num_attention_heads 4 is not a multiple of 3"), std::string::npos) << tp3.out;
  const CommandRun ep = run_m3serve("serve models/minimax-m3-tiny --data-parallel-size 16 --enable-expert-parallel");
  EXPECT_EQ(WEXITSTATUS(ep.status), 1) << ep.out;
  EXPECT_NE(ep.out.find("EP size 16 (-tp 1 x --data-parallel-size 16) is more ranks than num_local_experts 8"),
            std::string::npos)
      << ep.out;
}

}  // namespace
