// A model split over in-process CPU ranks (Gloo, a thread per rank) against the same model on one
// rank: tensor parallel (query / KV heads, KV head replication past the KV head count, index heads,
// dense and shared-expert widths, vocab-parallel embedding and head over a vocabulary the ranks do
// not divide) and expert parallel, on fresh configs whose counts divide only some sizes and on
// the bundled tiny checkpoint; and data-parallel attention (DEP), copies of one or several tp ranks
// with their own tokens (one copy idle), the experts shared out over every rank.
//  - logits of a mixed prefill step and of decode steps: within kLogitTolerance (float32; the
//    ranks' partial sums are added in another order than one rank's dot products);
//  - greedy generation through the engine over many prompts: identical tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <random>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/minimax_m3_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/minimax_m3.h"
#include "model/weight_footprint.h"
#include "model/weight_shard.h"
#include "model/weights.h"
#include "parallel/gloo_communicator.h"
#include "parallel/layout.h"
#include "parallel/rank_workers.h"
#include "tests/support/simple_kv_allocator.h"

namespace m3 {
namespace {

// max |logit - one rank's| / max |one rank's logit| over a step, float32 activations.
constexpr double kLogitTolerance = 2e-5;
constexpr int64_t kBlocks = 64;

// A config of `layers` layers alternating dense/full and MoE/sparse, with the given counts.
ModelConfig make_config(int heads, int kv_heads, int experts, int vocab, int intermediate) {
  nlohmann::json j = {
      {"model_type", "minimax_m3_vl_text"}, {"vocab_size", vocab}, {"hidden_size", 96},
      {"num_hidden_layers", 3}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
      {"head_dim", 16}, {"intermediate_size", intermediate}, {"shared_intermediate_size", 2 * intermediate},
      {"dense_intermediate_size", 3 * intermediate}, {"num_local_experts", experts}, {"num_experts_per_tok", 2},
      {"max_position_embeddings", 512},
      {"rope_parameters", {{"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}},
      {"layer_types", {"full_attention", "minimax_m3_sparse", "minimax_m3_sparse"}},
      {"mlp_layer_types", {"dense", "sparse", "sparse"}},
      {"index_n_heads", kv_heads}, {"index_head_dim", 16}, {"index_block_size", 8}, {"index_topk_blocks", 2},
      {"index_local_blocks", 1}, {"index_init_blocks", 0}};
  return parse_model_config(j, fmt::format("test config {}h/{}kv/{}e/v{}", heads, kv_heads, experts, vocab));
}

ModelRuntimeOptions f32_options() {
  ModelRuntimeOptions o;
  o.activation_dtype = DType::kF32;
  o.kv_dtype = KvDType::kF32;
  o.index_dtype = KvDType::kF32;
  o.num_kv_blocks = kBlocks;
  return o;
}

// The model on `parallel`'s ranks, each on its own CPU backend and thread.
struct SplitModel {
  ParallelLayout layout;
  std::unique_ptr<RankWorkers> workers;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<MiniMaxM3>> models;

  std::unique_ptr<ModelRunner> runner() {
    std::vector<MiniMaxM3*> ranks;
    for (auto& m : models) ranks.push_back(m.get());
    return std::make_unique<MiniMaxM3Runner>(ranks, *workers);
  }
};

std::unique_ptr<SplitModel> split(const ModelConfig& config, const ModelWeights& full, const ParallelConfig& parallel,
                                  bool dcp) {
  auto s = std::make_unique<SplitModel>();
  s->layout = make_parallel_layout(parallel, model_geometry(config));
  const int n = parallel.world_size();
  s->workers = std::make_unique<RankWorkers>(n);
  s->backends.resize(n);
  s->comms.resize(n);
  s->models.resize(n);
  GlooRendezvous rendezvous = GlooRendezvous::in_process();
  s->workers->run([&](int r) {
    s->backends[r] = make_cpu_backend();
    s->comms[r] = connect_gloo(rendezvous, r, n, "tp");
    ModelPartition partition{s->layout.ranks[r], s->layout.padded_vocab_size, s->comms[r].get(), dcp};
    s->models[r] = std::make_unique<MiniMaxM3>(config, shard_weights(full, config, s->layout.ranks[r]),
                                               *s->backends[r], f32_options(), partition);
  });
  return s;
}

// Prompts of varied lengths (some past a block, one several blocks) with ids over the vocabulary.
std::vector<std::vector<int32_t>> prompts(int vocab, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> p(3 + (i * 7) % 29);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % vocab);
    out.push_back(std::move(p));
  }
  return out;
}

// A prefill step of three sequences (all logits rows), then four decode steps; logits of each.
std::vector<std::vector<float>> step_logits(ModelRunner& runner, int vocab) {
  SimpleKvAllocator kv(kBlocks, runner.block_size());
  const auto ps = prompts(vocab, 3, 11);
  std::vector<int> seqs;
  std::vector<StepChunk> chunks;
  for (const auto& p : ps) {
    seqs.push_back(kv.add_sequence());
    chunks.push_back({seqs.back(), p, true});
  }
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 5; ++step) {
    const StepBatch batch = kv.build_step(chunks);
    std::vector<float> logits(batch.logits_rows.size() * size_t(vocab));
    runner.forward(batch, logits.data());
    out.push_back(logits);
    chunks.clear();
    for (size_t s = 0; s < seqs.size(); ++s) chunks.push_back({seqs[s], {int32_t((step * 31 + s * 17) % vocab)}, false});
  }
  return out;
}

// Greedy completions of `ps` through an engine over `lanes` (one, or a lane per DEP rank).
std::vector<std::vector<int32_t>> greedy(std::vector<std::unique_ptr<ModelRunner>> lanes,
                                         const std::vector<std::vector<int32_t>>& ps, int max_tokens,
                                         int max_num_seqs = 8) {
  EngineConfig config;
  config.max_num_seqs = max_num_seqs;  // several batches, chunked prefill of the long prompts
  config.max_num_batched_tokens = 32;
  EngineCore engine(std::move(lanes), config);
  std::vector<std::vector<int32_t>> out(ps.size());
  std::vector<std::promise<void>> done(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    EngineRequest r;
    r.id = std::to_string(i);
    r.prompt_token_ids = ps[i];
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    engine.add_request(std::move(r), [&, i](const RequestOutput& o) {
      out[i].insert(out[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        EXPECT_EQ(o.finish_reason, FinishReason::kLength) << o.error;
        done[i].set_value();
      }
    });
  }
  engine.start();
  for (auto& d : done) d.get_future().wait();
  engine.shutdown(true);
  EXPECT_EQ(engine.stats().finished_length, ps.size());
  return out;
}

std::vector<std::vector<int32_t>> greedy(std::unique_ptr<ModelRunner> runner, const std::vector<std::vector<int32_t>>& ps,
                                         int max_tokens) {
  std::vector<std::unique_ptr<ModelRunner>> lanes;
  lanes.push_back(std::move(runner));
  return greedy(std::move(lanes), ps, max_tokens);
}

struct Layout {
  int tp = 1;
  bool ep = false;
  bool dcp = false;  // indexer decode context parallel over the tp ranks
  std::string name() const { return fmt::format("-tp {}{}{}", tp, ep ? " EP" : "", dcp ? " DCP" : ""); }
};

void expect_same_as_one_rank(const ModelConfig& config, const ModelWeights& full, const std::vector<Layout>& layouts) {
  auto one_backend = make_cpu_backend();
  MiniMaxM3 one(config, full, *one_backend, f32_options());
  MiniMaxM3Runner one_runner(one);
  const auto reference = step_logits(one_runner, config.vocab_size);
  const auto ps = prompts(config.vocab_size, 12, 5);
  MiniMaxM3 one_for_engine(config, full, *one_backend, f32_options());
  const auto reference_tokens = greedy(std::make_unique<MiniMaxM3Runner>(one_for_engine), ps, 12);
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name());
    ParallelConfig p;
    p.tensor_parallel_size = l.tp;
    p.enable_expert_parallel = l.ep;
    auto model = split(config, full, p, l.dcp);
    auto runner = model->runner();
    const auto logits = step_logits(*runner, config.vocab_size);
    ASSERT_EQ(logits.size(), reference.size());
    for (size_t s = 0; s < logits.size(); ++s) {
      double scale = 0, diff = 0;
      for (size_t i = 0; i < logits[s].size(); ++i) {
        scale = std::max(scale, double(std::fabs(reference[s][i])));
        diff = std::max(diff, double(std::fabs(logits[s][i] - reference[s][i])));
      }
      EXPECT_LE(diff, kLogitTolerance * scale) << "step " << s;
    }
    EXPECT_EQ(greedy(std::move(runner), ps, 12), reference_tokens);
  }
}

// 8 query heads over 2 KV heads, 4 experts, a vocabulary of 1001 (odd): -tp 2 splits the KV
// heads, -tp 4 replicates each over two ranks; EP over 2 and 4 ranks.
TEST(TensorParallel, SplitsAndReplicatedKvHeadsMatchOneRank) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  const ModelWeights full = make_dummy_weights(config, 7);
  expect_same_as_one_rank(config, full,
                          {{2, false}, {4, false}, {2, true}, {4, true}, {2, false, true}, {4, false, true}});
}

// 6 query heads over 3 KV heads, 6 experts of width 48: -tp 3 (one KV head each), EP 3.
TEST(TensorParallel, ThreeRanksMatchOneRank) {
  const ModelConfig config = make_config(6, 3, 6, 500, 48);
  const ModelWeights full = make_dummy_weights(config, 9);
  expect_same_as_one_rank(config, full, {{3, false}, {3, true}, {3, true, true}});
}

// The bundled tiny checkpoint (real trained weights, 8-token blocks): -tp 2 and -tp 4, EP 2.
TEST(TensorParallel, TinyCheckpointMatchesOneRank) {
  const std::filesystem::path dir = "models/minimax-m3-tiny";
  const ModelConfig config = load_model_config(dir);
  const ModelWeights full = load_weights(config, dir);
  expect_same_as_one_rank(config, full, {{2, false}, {4, false}, {2, true}, {2, false, true}, {4, false, true}});
}

// Data-parallel attention (DEP): each copy of tp ranks runs its own sequences through the attention
// (split over its ranks as in -tp), the routed experts shared out over all ranks. Groups as the
// loader makes them: the copy's tp group, and per tp rank the expert group across the copies.
struct DepModel {
  ParallelLayout layout;
  int tp = 1;
  std::unique_ptr<RankWorkers> workers;  // every rank: the logits checks drive each model directly
  std::vector<std::unique_ptr<RankWorkers>> copy_workers;  // -tp > 1: each copy's ranks, for its lane
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> tp_comms, ep_comms;
  std::vector<std::unique_ptr<MiniMaxM3>> models;

  // One runner per copy, as make_engine gives each engine lane.
  std::vector<std::unique_ptr<ModelRunner>> lanes() {
    std::vector<std::unique_ptr<ModelRunner>> out;
    if (tp == 1) {
      for (auto& m : models) out.push_back(std::make_unique<MiniMaxM3Runner>(*m));
      return out;
    }
    for (size_t d = 0; d < copy_workers.size(); ++d) {
      std::vector<MiniMaxM3*> copy;
      for (int j = 0; j < tp; ++j) copy.push_back(models[d * tp + j].get());
      out.push_back(std::make_unique<MiniMaxM3Runner>(std::move(copy), *copy_workers[d]));
    }
    return out;
  }
};

std::unique_ptr<DepModel> dep_split(const ModelConfig& config, const ModelWeights& full, int dp, int tp = 1) {
  auto s = std::make_unique<DepModel>();
  ParallelConfig p;
  p.data_parallel_size = dp;
  p.tensor_parallel_size = tp;
  p.enable_expert_parallel = true;
  s->layout = make_parallel_layout(p, model_geometry(config));
  s->tp = tp;
  const int world = dp * tp;
  s->workers = std::make_unique<RankWorkers>(world);
  if (tp > 1)
    for (int d = 0; d < dp; ++d) s->copy_workers.push_back(std::make_unique<RankWorkers>(tp));
  s->backends.resize(world);
  s->tp_comms.resize(world);
  s->ep_comms.resize(world);
  s->models.resize(world);
  GlooRendezvous rendezvous = GlooRendezvous::in_process();
  s->workers->run([&](int r) {
    const RankShard& shard = s->layout.ranks[r];
    s->backends[r] = make_cpu_backend();
    if (tp > 1) s->tp_comms[r] = connect_gloo(rendezvous, shard.tp_rank, tp, fmt::format("tp.{}", shard.dp_rank));
    s->ep_comms[r] = connect_gloo(rendezvous, shard.dp_rank, dp, fmt::format("ep.{}", shard.tp_rank));
    ModelPartition partition{shard, s->layout.padded_vocab_size, s->tp_comms[r].get(), false, s->ep_comms[r].get(),
                             s->ep_comms[r].get()};
    s->models[r] = std::make_unique<MiniMaxM3>(config, shard_weights(full, config, shard), *s->backends[r],
                                               f32_options(), partition);
  });
  return s;
}

// Copy d prefills its own prompts (copy `idle` has none and idles) while the others run theirs;
// every rank's logits match one rank's on its copy's prompts.
void expect_dep_logits_match(const ModelConfig& config, const ModelWeights& full, int dp, int tp, int idle) {
  SCOPED_TRACE(fmt::format("DEP {} x -tp {}, copy {} idle", dp, tp, idle));
  auto one_backend = make_cpu_backend();
  MiniMaxM3 one(config, full, *one_backend, f32_options());
  auto dep = dep_split(config, full, dp, tp);
  const auto ps = prompts(config.vocab_size, 2 * dp, 21);
  auto batch_of = [&](int copy, SimpleKvAllocator& kv) {
    std::vector<StepChunk> chunks;
    for (int i = copy; i < 2 * dp; i += dp) chunks.push_back({kv.add_sequence(), ps[i], true});
    return kv.build_step(chunks);
  };
  std::vector<std::vector<float>> got(dp * tp);
  dep->workers->run([&](int r) {
    const int copy = r / tp;
    if (copy == idle) return dep->models[r]->idle_step();
    SimpleKvAllocator kv(kBlocks, dep->models[r]->block_size());
    const StepBatch b = batch_of(copy, kv);
    got[r].resize(b.logits_rows.size() * size_t(config.vocab_size));
    dep->models[r]->forward(b, got[r].data());
  });
  for (int r = 0; r < dp * tp; ++r) {
    const int copy = r / tp;
    if (copy == idle) continue;
    SimpleKvAllocator kv(kBlocks, one.block_size());
    const StepBatch b = batch_of(copy, kv);
    std::vector<float> want(b.logits_rows.size() * size_t(config.vocab_size));
    one.forward(b, want.data());
    ASSERT_EQ(got[r].size(), want.size()) << "rank " << r;
    double scale = 0, diff = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, double(std::fabs(want[i])));
      diff = std::max(diff, double(std::fabs(got[r][i] - want[i])));
    }
    EXPECT_LE(diff, kLogitTolerance * scale) << "rank " << r << " (copy " << copy << ")";
  }
}

// Greedy completions through an engine with one lane per DEP copy equal one rank's.
void expect_dep_greedy_match(const ModelConfig& config, const ModelWeights& full, int dp, int tp = 1) {
  auto one_backend = make_cpu_backend();
  MiniMaxM3 one(config, full, *one_backend, f32_options());
  const auto ps = prompts(config.vocab_size, 12, 5);
  const auto want = greedy(std::make_unique<MiniMaxM3Runner>(one), ps, 12);
  auto dep = dep_split(config, full, dp, tp);
  EXPECT_EQ(greedy(dep->lanes(), ps, 12, /*max_num_seqs=*/4), want) << "DEP " << dp << " x -tp " << tp;
}

TEST(DataParallelAttention, RanksWithTheirOwnTokensMatchOneRank) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  const ModelWeights full = make_dummy_weights(config, 7);
  for (int ranks : {2, 4}) expect_dep_logits_match(config, full, ranks, 1, -1);
  const ModelConfig six = make_config(6, 3, 6, 500, 48);
  expect_dep_logits_match(six, make_dummy_weights(six, 9), 3, 1, 1);  // rank 1 idles
}

// DEP with tensor-parallel copies: 2 x 2 (a KV head per rank, an expert per rank), with both
// copies busy and with one idle; 2 x 3 over 6 heads / 3 KV heads / 6 experts; 3 x 2 (copy 1 idle)
// over 6 experts.
TEST(DataParallelAttention, TensorParallelCopiesMatchOneRank) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  const ModelWeights full = make_dummy_weights(config, 7);
  expect_dep_logits_match(config, full, 2, 2, -1);
  expect_dep_logits_match(config, full, 2, 2, 0);
  const ModelConfig six = make_config(6, 3, 6, 500, 48);
  expect_dep_logits_match(six, make_dummy_weights(six, 9), 2, 3, -1);
  const ModelConfig six_experts = make_config(8, 2, 6, 1001, 32);
  expect_dep_logits_match(six_experts, make_dummy_weights(six_experts, 13), 3, 2, 1);
}

TEST(DataParallelAttention, EngineLanesGiveOneRanksGreedyTokens) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  const ModelWeights full = make_dummy_weights(config, 7);
  expect_dep_greedy_match(config, full, 2);
  expect_dep_greedy_match(config, full, 4);
  const std::filesystem::path dir = "models/minimax-m3-tiny";
  const ModelConfig tiny = load_model_config(dir);
  expect_dep_greedy_match(tiny, load_weights(tiny, dir), 2);
}

// Each lane drives its copy's tp ranks on their own threads while the other lanes drive theirs.
TEST(DataParallelAttention, TensorParallelCopiesGiveOneRanksGreedyTokens) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  expect_dep_greedy_match(config, make_dummy_weights(config, 7), 2, 2);
  const std::filesystem::path dir = "models/minimax-m3-tiny";
  const ModelConfig tiny = load_model_config(dir);
  expect_dep_greedy_match(tiny, load_weights(tiny, dir), 2, 2);
}

// Layouts DEP cannot split: -tp not dividing the heads of each copy, more ranks than experts.
TEST(DataParallelAttention, LayoutsThatDoNotSplitAreRefused) {
  const ModelGeometry g = model_geometry(make_config(8, 2, 4, 1001, 32));
  const auto refusal = [&](int dp, int tp) {
    ParallelConfig p;
    p.data_parallel_size = dp;
    p.tensor_parallel_size = tp;
    p.enable_expert_parallel = true;
    try {
      make_parallel_layout(p, g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(refusal(2, 3),
            "-tp 3 (the ranks of each of the --data-parallel-size 2 copies): num_attention_heads 8 is not a multiple "
            "of 3");
  EXPECT_EQ(refusal(4, 2),
            "--enable-expert-parallel: EP size 8 (-tp 2 x --data-parallel-size 4) is more ranks than "
            "num_local_experts 4; a rank would hold no expert");
  EXPECT_EQ(refusal(3, 1), "--enable-expert-parallel: num_local_experts 4 is not a multiple of the EP size 3 (-tp 1 "
                           "x --data-parallel-size 3)");
  // A copy of 4 ranks over 2 KV heads replicates each, as -tp 4 does; the model splits.
  const ParallelLayout ok = make_parallel_layout(ParallelConfig{4, 1, true}, g);
  EXPECT_EQ(ok.kv_head_replicas, 2);
  const ParallelLayout two_by_two = make_parallel_layout(ParallelConfig{2, 2, true}, g);
  ASSERT_EQ(two_by_two.ranks.size(), 4u);
  for (const RankShard& r : two_by_two.ranks) {
    EXPECT_EQ(r.dp_rank, r.rank / 2);
    EXPECT_EQ(r.tp_rank, r.rank % 2);
    EXPECT_EQ(r.q_heads, (Slice{4 * r.tp_rank, 4}));
    EXPECT_EQ(r.kv_heads, (Slice{r.tp_rank, 1}));
    EXPECT_EQ(r.experts, (Slice{r.rank, 1}));  // by global rank: every rank holds its own expert
    EXPECT_EQ(r.vocab, (Slice{501 * r.tp_rank, 501}));
  }
}

TEST(TensorParallel, ShardWithoutItsGroupIsRefused) {
  const ModelConfig config = make_config(8, 2, 4, 1001, 32);
  const ModelWeights full = make_dummy_weights(config, 7);
  ParallelConfig p;
  p.tensor_parallel_size = 2;
  const ParallelLayout layout = make_parallel_layout(p, model_geometry(config));
  auto backend = make_cpu_backend();
  // Rank 1's slices but no group: the vocabulary slice cannot cover the padded vocabulary.
  EXPECT_THROW(MiniMaxM3(config, shard_weights(full, config, layout.ranks[1]), *backend, f32_options(),
                         ModelPartition{layout.ranks[1], layout.padded_vocab_size, nullptr}),
               Error);
}

}  // namespace
}  // namespace m3
