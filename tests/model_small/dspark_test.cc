// The shipped DSpark drafter (models/minimax-m3-small/dspark) on the CPU against its PyTorch
// reference (tools/train/dspark.py fixture: the target with f32 numerics and MSA, the drafter in
// fp32): after each prompt, the same greedy drafts, base logits within 1e-4 and the same
// confidence within 1e-3 (measured: logits within 5e-6). Also what the loader refuses.
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

// The target (f32 on the CPU, a pool of 8 blocks) handing its taps to the shipped drafter.
struct TargetAndDrafter {
  TargetAndDrafter() : config(load_model_config(kTarget)), host(load_weights(config, kTarget)) {
    backend = make_cpu_backend();
    options.num_kv_blocks = 8;
    block = config.index_block_size;
    drafter = make_dspark_drafter(kTarget / "dspark", config, host, 8 * int64_t(block), block);
    model = std::make_unique<MiniMaxM3>(config, load_weights(config, kTarget), *backend, options);
    model->set_tap_layers(drafter->config().target_layer_ids);
  }
  ModelConfig config;
  ModelWeights host;
  ModelRuntimeOptions options;
  int block = 0;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DSparkDrafter> drafter;
  std::unique_ptr<MiniMaxM3> model;
};


TEST(DSparkDrafter, MatchesThePyTorchReference) {
  TargetAndDrafter t;
  const ModelConfig& config = t.config;
  const int block = t.block;
  MiniMaxM3& model = *t.model;
  DSparkDrafter* drafter = t.drafter.get();

  std::ifstream in("tests/model_small/dspark_reference.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["cases"].size(), 4u);
  for (const nlohmann::json& c : ref["cases"]) {
    const std::vector<int32_t> prompt = c["prompt"].get<std::vector<int32_t>>();
    SimpleKvAllocator kv(8, block);
    const int seq = kv.add_sequence();
    // The context in two steps, so that the drafter's cache is filled across steps.
    const size_t split = (prompt.size() - 1) / 2;
    std::vector<int32_t> block_table;
    for (auto [begin, end] : {std::pair<size_t, size_t>{0, split}, {split, prompt.size() - 1}}) {
      const StepBatch batch = kv.build_step({{seq, std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end)}});
      std::vector<float> logits(config.vocab_size);
      model.forward(batch, logits.data());
      drafter->ingest(batch, model.taps());
      block_table.assign(batch.page_table.begin(), batch.page_table.begin() + batch.pages_per_seq);
    }
    DSparkBlock b;
    b.anchor = prompt.back();
    b.anchor_pos = static_cast<int32_t>(prompt.size() - 1);
    b.block_table = block_table;
    b.num_drafts = drafter->config().block_size;
    const DSparkDrafts d = drafter->propose(b, /*keep_logits=*/true);
    EXPECT_EQ(d.tokens, c["drafts"].get<std::vector<int32_t>>()) << "prompt of " << prompt.size();
    const auto top_ids = c["base_top_ids"].get<std::vector<std::vector<int32_t>>>();
    const auto top_logits = c["base_top_logits"].get<std::vector<std::vector<float>>>();
    double worst = 0;
    for (size_t j = 0; j < top_ids.size(); ++j)
      for (size_t i = 0; i < top_ids[j].size(); ++i)
        worst = std::max<double>(worst, std::abs(d.base_logits[j * config.vocab_size + top_ids[j][i]] - top_logits[j][i]));
    EXPECT_LT(worst, 1e-4) << "prompt of " << prompt.size();
    const auto conf = c["confidence"].get<std::vector<float>>();
    for (size_t j = 0; j < conf.size(); ++j) EXPECT_NEAR(d.confidence[j], conf[j], 1e-3) << j;
    std::printf("[dspark] prompt of %zu tokens: drafts match, base logits within %.2e\n", prompt.size(), worst);
  }
}

// The host tier: the drafter's part of blocks copied out, overwritten, copied back, gives the
// drafts of before (and the overwrite alone does not).
TEST(DSparkDrafter, BlocksGoToTheHostTierAndComeBack) {
  TargetAndDrafter t;
  const ModelConfig& config = t.config;
  const int block = t.block;
  MiniMaxM3& model = *t.model;
  DSparkDrafter* drafter = t.drafter.get();
  std::ifstream in("tests/model_small/dspark_reference.json");
  const std::vector<int32_t> prompt = nlohmann::json::parse(in)["cases"][2]["prompt"].get<std::vector<int32_t>>();
  SimpleKvAllocator kv(8, block);
  const int seq = kv.add_sequence();
  const StepBatch batch = kv.build_step({{seq, std::vector<int32_t>(prompt.begin(), prompt.end() - 1)}});
  std::vector<float> logits(config.vocab_size);
  model.forward(batch, logits.data());
  drafter->ingest(batch, model.taps());
  const std::vector<int32_t> table(batch.page_table.begin(), batch.page_table.begin() + batch.pages_per_seq);
  DSparkBlock b;
  b.anchor = prompt.back();
  b.anchor_pos = static_cast<int32_t>(prompt.size() - 1);
  b.block_table = table;
  b.num_drafts = drafter->config().block_size;
  const DSparkDrafts before = drafter->propose(b, true);

  KvBlockCopies out, back;
  for (size_t i = 0; i < table.size(); ++i) {
    out.to_host.push_back({table[i], int64_t(i)});
    back.to_device.push_back({table[i], int64_t(i)});
  }
  drafter->copy_blocks(out);
  std::vector<float> noise(model.taps().size());
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = float((i * 2654435761u) % 1000) / 250.0f - 2.0f;
  drafter->ingest(batch, noise);  // the pool's blocks now hold another context
  EXPECT_NE(drafter->propose(b, true).base_logits, before.base_logits);
  drafter->copy_blocks(back);
  const DSparkDrafts after = drafter->propose(b, true);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.base_logits, before.base_logits);
  KvBlockCopies empty_slot;
  empty_slot.to_device.push_back({table[0], 31});
  EXPECT_THROW(drafter->copy_blocks(empty_slot), Error);  // a slot that holds nothing
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
