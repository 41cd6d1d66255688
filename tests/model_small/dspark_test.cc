// The shipped DSpark drafter (models/minimax-m3-small/dspark) on the CPU backend against its PyTorch
// reference (tools/train/dspark.py fixture: the target with f32 numerics and MSA, the drafter in
// fp32): after each prompt, the same greedy drafts, base logits within 1e-4 and the same
// confidence within 1e-3 (measured: logits within 5e-6), alone and four prompts in one step. Also
// fewer drafts, the host tier and what the loader refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/dspark.h"
#include "model/minimax_m3.h"
#include "model/weights.h"
#include "tests/support/simple_kv_allocator.h"

namespace m3 {
namespace {

const std::filesystem::path kTarget = "models/minimax-m3-small";

// The target (f32 on the CPU, a pool of 24 blocks and a host tier of 8) feeding the shipped
// drafter through its taps.
struct TargetAndDrafter {
  TargetAndDrafter() : config(load_model_config(kTarget)) {
    backend = make_cpu_backend();
    options.num_kv_blocks = 24;
    options.num_host_kv_blocks = 8;
    block = config.index_block_size;
    model = std::make_unique<MiniMaxM3>(config, load_weights(config, kTarget), *backend, options);
    drafter = load_dspark_drafter(kTarget / "dspark", config, *backend, model->weights().embed,
                                  model->weights().lm_head, options.num_kv_blocks, block, KvDType::kF32,
                                  options.num_host_kv_blocks);
    model->set_taps(drafter.get());
  }
  ~TargetAndDrafter() { model->set_taps(nullptr); }
  ModelConfig config;
  ModelRuntimeOptions options;
  int block = 0;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
  std::unique_ptr<DSparkDrafter> drafter;
};

std::vector<std::vector<int32_t>> reference_prompts() {
  std::ifstream in("tests/model_small/dspark_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& c : ref["cases"]) prompts.push_back(c["prompt"].get<std::vector<int32_t>>());
  return prompts;
}

// The four reference prompts' contexts (all but the last token) as four sequences, in two steps so
// that the drafter's cache is filled across steps; their blocks (the page-table rows).
std::vector<std::vector<int32_t>> prefill(TargetAndDrafter& t, SimpleKvAllocator& kv,
                                          const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<int> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(kv.add_sequence());
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (int half = 0; half < 2; ++half) {
    std::vector<StepChunk> chunks;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t split = (prompts[i].size() - 1) / 2, end = half ? prompts[i].size() - 1 : split;
      chunks.push_back({seqs[i], std::vector<int32_t>(prompts[i].begin() + (half ? split : 0), prompts[i].begin() + end)});
    }
    const StepBatch batch = kv.build_step(chunks);
    std::vector<float> logits(batch.logits_rows.size() * size_t(t.config.vocab_size));
    t.model->forward(batch, logits.data());
    for (size_t i = 0; i < prompts.size(); ++i)
      tables[i].assign(batch.page_table.begin() + i * batch.pages_per_seq,
                       batch.page_table.begin() + (i + 1) * batch.pages_per_seq);
  }
  return tables;
}

std::vector<DSparkBlock> blocks_of(const std::vector<std::vector<int32_t>>& prompts,
                                   const std::vector<std::vector<int32_t>>& tables, int drafts) {
  std::vector<DSparkBlock> blocks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    DSparkBlock b;
    b.anchor = prompts[i].back();
    b.anchor_pos = static_cast<int32_t>(prompts[i].size() - 1);
    b.block_table = tables[i];
    b.num_drafts = drafts;
    blocks.push_back(b);
  }
  return blocks;
}

// All four prompts drafted in one step of the drafter, and each alone: the reference's drafts.
TEST(DSparkDrafter, MatchesThePyTorchReference) {
  TargetAndDrafter t;
  const ModelConfig& config = t.config;
  std::ifstream in("tests/model_small/dspark_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["cases"].size(), 4u);
  const std::vector<std::vector<int32_t>> prompts = reference_prompts();
  SimpleKvAllocator kv(t.options.num_kv_blocks, t.block);
  const std::vector<std::vector<int32_t>> tables = prefill(t, kv, prompts);
  const std::vector<DSparkBlock> blocks = blocks_of(prompts, tables, t.drafter->config().block_size);
  const std::vector<DSparkDrafts> together = t.drafter->propose(blocks, /*keep_logits=*/true);
  ASSERT_EQ(together.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const nlohmann::json& c = ref["cases"][i];
    const DSparkDrafts d = t.drafter->propose(std::span(&blocks[i], 1), true)[0];
    EXPECT_EQ(d.tokens, together[i].tokens) << "prompt " << i << " alone and in the batch";
    EXPECT_EQ(d.tokens, c["drafts"].get<std::vector<int32_t>>()) << "prompt of " << prompts[i].size();
    const auto top_ids = c["base_top_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto top_logits = c["base_top_logits"].get<std::vector<std::vector<float>>>();
    double worst = 0;
    for (size_t j = 0; j < top_ids.size(); ++j)
      for (size_t k = 0; k < top_ids[j].size(); ++k)
        worst = std::max<double>(worst, std::abs(d.base_logits[j * config.vocab_size + top_ids[j][k]] - top_logits[j][k]));
    EXPECT_LT(worst, 1e-4) << "prompt of " << prompts[i].size();
    const auto conf = c["confidence"].get<std::vector<float>>();
    for (size_t j = 0; j < conf.size(); ++j) EXPECT_NEAR(d.confidence[j], conf[j], 1e-3) << j;
    std::printf("[dspark] prompt of %zu tokens: drafts match, base logits within %.2e\n", prompts[i].size(), worst);
  }
}

// Fewer drafts than the block: the first ones of the full block.
TEST(DSparkDrafter, FewerDraftsAreTheFirstOnes) {
  TargetAndDrafter t;
  const std::vector<std::vector<int32_t>> prompts = reference_prompts();
  SimpleKvAllocator kv(t.options.num_kv_blocks, t.block);
  const std::vector<std::vector<int32_t>> tables = prefill(t, kv, prompts);
  const std::vector<DSparkDrafts> all = t.drafter->propose(blocks_of(prompts, tables, t.drafter->config().block_size));
  const std::vector<DSparkDrafts> three = t.drafter->propose(blocks_of(prompts, tables, 3));
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(three[i].tokens.size(), 3u);
    EXPECT_EQ(three[i].tokens, std::vector<int32_t>(all[i].tokens.begin(), all[i].tokens.begin() + 3));
  }
}

// The host tier: the drafter's part of blocks copied out, overwritten by another context, copied
// back, gives the drafts of before (and the overwrite alone does not).
TEST(DSparkDrafter, BlocksGoToTheHostTierAndComeBack) {
  TargetAndDrafter t;
  const std::vector<std::vector<int32_t>> prompts = {reference_prompts()[2]};
  SimpleKvAllocator kv(t.options.num_kv_blocks, t.block);
  const std::vector<std::vector<int32_t>> tables = prefill(t, kv, prompts);
  const std::vector<DSparkBlock> blocks = blocks_of(prompts, tables, t.drafter->config().block_size);
  const DSparkDrafts before = t.drafter->propose(blocks, true)[0];

  KvBlockCopies out, back;
  out.batch = 1;
  back.batch = 2;
  int64_t slot = 0;
  for (int32_t b : tables[0])
    if (b >= 0) {
      out.to_host.push_back({b, slot});
      back.to_device.push_back({b, slot++});
    }
  t.drafter->copy_blocks(out);
  // Another context in the same blocks (a fresh allocator hands them out in the same order).
  std::vector<int32_t> other = prompts[0];
  for (int32_t& id : other) id = (id * 7 + 3) % t.config.vocab_size;
  SimpleKvAllocator kv2(t.options.num_kv_blocks, t.block);
  ASSERT_EQ(prefill(t, kv2, {other}), tables);
  EXPECT_NE(t.drafter->propose(blocks, true)[0].base_logits, before.base_logits);
  t.drafter->copy_blocks(back);
  const DSparkDrafts after = t.drafter->propose(blocks, true)[0];
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.base_logits, before.base_logits);
  KvBlockCopies outside;
  outside.batch = 3;
  outside.to_device.push_back({tables[0][0], 31});  // the tier has 8 slots
  EXPECT_THROW(t.drafter->copy_blocks(outside), Error);
}

TEST(DSparkDrafter, ConfigErrorsNameTheField) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "m3-dspark-config-test";
  std::filesystem::create_directories(dir);
  nlohmann::json good = nlohmann::json::parse(std::ifstream(kTarget / "dspark" / "config.json"));
  auto error_of = [&](nlohmann::json j) {
    std::ofstream(dir / "config.json") << j.dump();
    try {
      load_dspark_config(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(good), "");
  nlohmann::json j = good;
  j["architectures"] = {"Qwen3DSparkModel"};
  EXPECT_NE(error_of(j).find("architectures"), std::string::npos);
  j = good;
  j["layer_types"] = {"full_attention"};
  EXPECT_NE(error_of(j).find("layer_types"), std::string::npos);
  j = good;
  j.erase("dspark_block_size");
  EXPECT_NE(error_of(j).find("dspark_block_size"), std::string::npos);
  j = good;
  j["dspark_noise_token_id"] = 999999;
  EXPECT_NE(error_of(j).find("dspark_noise_token_id"), std::string::npos);
  j = good;
  j["moe_layer_freq"] = {1};
  EXPECT_NE(error_of(j).find("moe_layer_freq"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace m3
