// A DEP copy on another host (engine/remote_copy_runner.h): node 0's RemoteCopyRunner against
// serve_remote_copy on the copy's node, two in-process Gloo ranks standing in for the two
// processes and a recording fake for the copy's own runner. Steps, their sampling (rows, lists,
// bitmasks) and the logits rows wanted arrive intact; the sampled ids, logits rows and copy times
// come back; idle steps and KV copies run there in order; a step that fails there is an m3::Error
// on node 0 naming the copy, and the channel keeps serving; stop ends the copy's loop.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/error.h"
#include "engine/dspark_blocks.h"
#include "engine/remote_copy_runner.h"
#include "ops/rejection_sampling.h"
#include "parallel/control_group.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rank_workers.h"

namespace m3 {
namespace {

constexpr int kVocab = 7;

// The copy's own runner: samples id = 100 * token + row's seed, logits row i = token ids + i.
class RecordingRunner final : public ModelRunner {
 public:
  int block_size() const override { return 16; }
  int64_t num_kv_blocks() const override { return 8; }
  int vocab_size() const override { return kVocab; }
  int64_t max_position_embeddings() const override { return 1024; }
  void forward(const StepBatch&, float*) override { FAIL() << "the engine's lanes only call forward_sample"; }
  void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                      RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits) override {
    if (batch.token_ids.front() < 0) fail("a rank of the copy failed on token {}", batch.token_ids.front());
    steps.push_back(batch);
    samplings.push_back(sampling);
    for (size_t i = 0; i < sampling.rows.size(); ++i) {
      const int row = sampling.rows[i].logits_row;
      sampled_ids[i] = 100 * batch.token_ids[batch.logits_rows[row]] + static_cast<int32_t>(sampling.rows[i].seed);
    }
    for (size_t i = 0; i < host_rows.size(); ++i)
      for (int v = 0; v < kVocab; ++v) host_logits[i * kVocab + v] = batch.token_ids[host_rows[i]] + 0.5f * v;
    // Logprob row j: its tokens (the drawn id filled in), rank = logits row, top ids = row + 1000.
    for (size_t j = 0; j < sampling.logprobs.size(); ++j) {
      const LogprobRow& q = sampling.logprobs[j];
      RowLogprobs& r = logprobs[j];
      logprob_row_tokens(q, sampled_ids, r.token);
      r.rank[0] = q.logits_row;
      r.num_top = q.top_k;
      for (int t = 0; t < q.top_k; ++t) r.top_id[t] = q.logits_row + 1000 + t;
    }
  }
  void idle_step() override { log += "idle;"; }
  void copy_kv_blocks(const KvBlockCopies& c) override { log += "copy " + std::to_string(c.batch) + ";"; }
  KvCopyTimes kv_copy_times() const override { return {0.25, 1.5}; }

  std::vector<StepBatch> steps;
  std::vector<SampleBatch> samplings;
  std::string log;
};

StepBatch step_of(std::vector<int32_t> tokens) {
  StepBatch b;
  const auto n = static_cast<int32_t>(tokens.size());
  b.token_ids = tokens;
  for (int32_t i = 0; i < n; ++i) {
    b.positions.push_back(i);
    b.token_seq.push_back(0);
    b.slot_mapping.push_back(i);
    b.logits_rows.push_back(i);
  }
  b.query_start = {0, n};
  b.seq_lens = {n};
  b.pages_per_seq = 1;
  b.page_table = {3};
  return b;
}

// A control group over `nodes` (one thread each standing in for a node's process).
std::vector<std::unique_ptr<ControlGroup>> connect(RankWorkers& nodes, const std::string& name,
                                                   std::chrono::seconds timeout) {
  GlooRendezvous rendezvous = GlooRendezvous::in_process();
  std::vector<std::unique_ptr<ControlGroup>> groups(nodes.size());
  nodes.run([&](int r) {
    groups[r] = std::make_unique<ControlGroup>(connect_gloo(rendezvous, r, nodes.size(), name), timeout);
  });
  return groups;
}

TEST(RemoteCopy, StepsSamplingAndRepliesCrossTheChannelIntact) {
  RankWorkers nodes(2);
  std::vector<std::unique_ptr<ControlGroup>> channel = connect(nodes, "copy.1", std::chrono::seconds(20));
  RecordingRunner copy;
  RemoteCopyCounts counts;
  std::string failure;
  nodes.run([&](int r) {
    if (r == 1) {
      counts = serve_remote_copy(*channel[1], copy, 1);
      return;
    }
    channel[0]->start_heartbeat();
    RemoteCopyGeometry g{16, 8, kVocab, 1024, 0, 0, 1, 1};
    RemoteCopyRunner runner(*channel[0], g);
    EXPECT_EQ(runner.vocab_size(), kVocab);

    SampleBatch sampling;
    SampleRow a;
    a.logits_row = 2;
    a.temperature = 0.7f;
    a.top_k = 5;
    a.seed = 7;
    const int32_t prompt[] = {4, 9}, output[] = {11}, counts_of[] = {3};
    const int32_t bias_ids[] = {1, 5};
    const float bias_values[] = {-2.5f, 100.0f};
    sampling.add(a, prompt, 2, output, counts_of, 1, nullptr, 0, bias_ids, bias_values, 2);
    SampleRow b;
    b.logits_row = 0;
    b.seed = 3;
    b.allowed_row = sampling.add_allowed_row(1);
    sampling.allowed[0] = 0x5u;
    sampling.add(b, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
    int32_t ids[2] = {-1, -1};
    std::vector<float> logits(2 * kVocab, -1.0f);
    KvBlockCopies kv;
    kv.batch = 4;
    runner.copy_kv_blocks(kv);
    LogprobRow drawn;  // the logprobs of row 1's draw and of token 4, top 3
    drawn.logits_row = 0;
    drawn.top_k = 3;
    drawn.drawn_by[0] = 1;
    drawn.token[1] = 4;
    LogprobRow literal;
    literal.logits_row = 2;
    literal.token[0] = 9;
    sampling.logprobs = {drawn, literal};
    RowLogprobs lp[2];
    runner.forward_sample(step_of({10, 20, 30}), sampling, ids, lp, {1, 2}, logits.data());
    EXPECT_EQ(ids[0], 100 * 30 + 7);
    EXPECT_EQ(ids[1], 100 * 10 + 3);
    EXPECT_EQ(lp[0].token[0], 100 * 10 + 3);
    EXPECT_EQ(lp[0].token[1], 4);
    EXPECT_EQ(lp[0].num_top, 3);
    EXPECT_EQ(lp[0].top_id[2], 1002);
    EXPECT_EQ(lp[1].token[0], 9);
    EXPECT_EQ(lp[1].token[1], -1);
    EXPECT_EQ(lp[1].rank[0], 2);
    EXPECT_EQ(lp[1].num_top, 0);
    EXPECT_EQ(logits[0], 20.0f);
    EXPECT_EQ(logits[kVocab + 3], 31.5f);
    EXPECT_EQ(runner.kv_copy_times().to_device_s, 1.5);
    runner.idle_step();
    try {
      runner.forward_sample(step_of({-5}), SampleBatch{}, nullptr, nullptr, {}, nullptr);
    } catch (const Error& e) {
      failure = e.what();
    }
    // The channel serves on after a failed step; forward() returns every logits row.
    std::vector<float> all(2 * kVocab);
    runner.forward(step_of({40, 50}), all.data());
    EXPECT_EQ(all[kVocab], 50.0f);
    channel[0]->stop();
  });
  EXPECT_NE(failure.find("copy 1 (data-parallel rank 1 on node 1): its step failed there"), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("a rank of the copy failed on token -5"), std::string::npos) << failure;
  EXPECT_EQ(copy.log, "copy 4;idle;");
  EXPECT_EQ(counts.steps, 4);
  EXPECT_EQ(counts.sampled, 3);
  ASSERT_EQ(copy.steps.size(), 2u);
  EXPECT_EQ(copy.steps[0].token_ids, (std::vector<int32_t>{10, 20, 30}));
  EXPECT_EQ(copy.steps[0].page_table, (std::vector<int32_t>{3}));
  const SampleBatch& got = copy.samplings[0];
  ASSERT_EQ(got.rows.size(), 2u);
  EXPECT_EQ(got.rows[0].temperature, 0.7f);
  EXPECT_EQ(got.rows[0].top_k, 5);
  EXPECT_EQ(got.rows[0].num_prompt, 2);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{4, 9, 11, 1, 5}));
  EXPECT_EQ(got.counts, (std::vector<int32_t>{0, 0, 3, 0, 0}));
  EXPECT_EQ(got.biases, (std::vector<float>{0, 0, 0, -2.5f, 100.0f}));
  EXPECT_EQ(got.rows[0].num_bias, 2);
  EXPECT_EQ(got.allowed_words, 1);
  ASSERT_NE(got.allowed_mask(got.rows[1]), nullptr);
  EXPECT_EQ(got.allowed_mask(got.rows[1])[0], 0x5u);
  ASSERT_EQ(got.logprobs.size(), 2u);
  EXPECT_EQ(got.logprobs[0].drawn_by[0], 1);
  EXPECT_EQ(got.logprobs[0].token[1], 4);
  EXPECT_EQ(got.logprobs[0].top_k, 3);
  EXPECT_EQ(got.logprobs[1].logits_row, 2);
  EXPECT_EQ(copy.samplings[1].rows.size(), 0u);
}

// The copy's DSpark drafter runs there: node 0's proposals (one block per request that may draft:
// anchor, position, table, the sampled requests' parameters and draws) arrive intact, the drafts and
// the distributions of probabilistic ones come back; constraints stay on node 0 (drafts are cut
// there); a copy without a drafter answers with an error, which reaches node 0 as an m3::Error, and
// the channel serves on.
TEST(RemoteCopy, DraftsComeFromTheCopysDrafter) {
  RankWorkers nodes(2);
  std::vector<std::unique_ptr<ControlGroup>> channel = connect(nodes, "copy.draft", std::chrono::seconds(20));
  RecordingRunner copy;
  std::vector<DSparkBlock> seen;
  std::vector<std::vector<int32_t>> seen_tables;
  std::vector<std::vector<double>> seen_draws;
  std::vector<SampleRow> seen_sampling;
  const RemoteDraftFn draft = [&](std::span<const DSparkBlock> blocks) {
    std::vector<DSparkDrafts> out(blocks.size());
    for (size_t b = 0; b < blocks.size(); ++b) {
      seen.push_back(blocks[b]);
      seen_tables.emplace_back(blocks[b].block_table.begin(), blocks[b].block_table.end());
      seen_draws.emplace_back(blocks[b].draw_uniforms.begin(), blocks[b].draw_uniforms.end());
      seen_sampling.push_back(blocks[b].sampling ? *blocks[b].sampling : SampleRow{});
      for (int j = 0; j < blocks[b].num_drafts; ++j) out[b].tokens.push_back(blocks[b].anchor + j + 1);
      if (blocks[b].sampling) {
        for (int j = 0; j < blocks[b].num_drafts; ++j) {
          TokenDistribution row;
          row.ids = {out[b].tokens[size_t(j)], 6};
          row.mass = {0.75, 0.125 + j};
          row.total = 0.875 + j;
          out[b].rows.push_back(row);
        }
      }
    }
    return out;
  };
  RemoteCopyCounts counts;
  std::string missing;
  std::vector<Draft> drafts;
  nodes.run([&](int r) {
    if (r == 1) {
      counts = serve_remote_copy(*channel[1], copy, 1, draft);
      return;
    }
    channel[0]->start_heartbeat();
    RemoteCopyRunner runner(*channel[0], RemoteCopyGeometry{16, 8, kVocab, 1024, 0, 0, 1, 1});
    EXPECT_EQ(runner.drafter(), nullptr);
    runner.attach_dspark(/*block_size=*/3, /*probabilistic=*/true);
    ASSERT_NE(runner.drafter(), nullptr);
    EXPECT_FALSE(runner.drafter()->follows_constraints());
    SamplingParams greedy, sampled;
    greedy.temperature = 0.0f;
    sampled.temperature = 0.7f;
    sampled.top_k = 4;
    sampled.top_p = 0.9f;
    const std::vector<int32_t> text_a = {1, 2, 3, 4}, text_b = {5, 6}, text_c = {2};
    const std::vector<int32_t> table_a = {7}, table_b = {2, 5}, table_c = {1};
    std::vector<DraftRequest> requests(3);
    requests[0] = {text_a, 5, table_a, &greedy, 9, 3};       // more drafts than the block: 3
    requests[1] = {text_b, 2, table_b, &sampled, 77, 10};    // sampled: draws go with it
    requests[2] = {text_c, 2, table_c, &greedy, 1, 0};       // no context: no block
    runner.drafter()->propose(requests, drafts);
    channel[0]->stop();
  });
  EXPECT_EQ(counts.drafts, 1);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].anchor, 4);
  EXPECT_EQ(seen[0].anchor_pos, 3);
  EXPECT_EQ(seen[0].num_drafts, 3);
  EXPECT_EQ(seen_tables[0], (std::vector<int32_t>{7}));
  EXPECT_EQ(seen[0].sampling, nullptr);
  EXPECT_EQ(seen[0].constraint, nullptr);
  EXPECT_EQ(seen[1].anchor, 6);
  EXPECT_EQ(seen[1].anchor_pos, 1);
  EXPECT_EQ(seen_tables[1], (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(seen_sampling[1].temperature, 0.7f);
  EXPECT_EQ(seen_sampling[1].top_k, 4);
  EXPECT_EQ(seen_sampling[1].top_p, 0.9f);
  EXPECT_EQ(seen_draws[1], (std::vector<double>{draft_uniform(77, 10), draft_uniform(77, 11)}));
  ASSERT_EQ(drafts.size(), 3u);
  EXPECT_EQ(drafts[0].tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(drafts[0].rows.empty());
  EXPECT_EQ(drafts[1].tokens, (std::vector<int32_t>{7, 8}));
  ASSERT_EQ(drafts[1].rows.size(), 2u);
  EXPECT_EQ(drafts[1].rows[1].ids, (std::vector<int32_t>{8, 6}));
  EXPECT_EQ(drafts[1].rows[1].mass, (std::vector<double>{0.75, 1.125}));
  EXPECT_EQ(drafts[1].rows[1].total, 1.875);
  EXPECT_TRUE(drafts[2].tokens.empty());

  // A copy without a drafter: an error on node 0 naming the copy; the channel serves on.
  std::vector<std::unique_ptr<ControlGroup>> bare = connect(nodes, "copy.nodraft", std::chrono::seconds(20));
  nodes.run([&](int r) {
    if (r == 1) {
      serve_remote_copy(*bare[1], copy, 1);
      return;
    }
    bare[0]->start_heartbeat();
    RemoteCopyRunner runner(*bare[0], RemoteCopyGeometry{16, 8, kVocab, 1024, 0, 0, 1, 1});
    runner.attach_dspark(3, false);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    const std::vector<int32_t> text = {1, 2}, table = {0};
    std::vector<DraftRequest> requests = {{text, 2, table, &greedy, 1, 0}};
    try {
      runner.drafter()->propose(requests, drafts);
    } catch (const Error& e) {
      missing = e.what();
    }
    int32_t id = -1;
    SampleBatch sampling;
    SampleRow row;
    row.seed = 4;
    sampling.add(row, nullptr, 0, nullptr, nullptr, 0, nullptr, 0);
    runner.forward_sample(step_of({3}), sampling, &id, nullptr, {}, nullptr);
    EXPECT_EQ(id, 304);
    bare[0]->stop();
  });
  EXPECT_NE(missing.find("copy 1 (data-parallel rank 1 on node 1): its drafter failed there"), std::string::npos)
      << missing;
  EXPECT_NE(missing.find("has no DSpark drafter"), std::string::npos) << missing;
}

// The words of remote drafting are checked before they become a draft step.
TEST(RemoteCopy, CorruptDraftWordsAreErrors) {
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  const std::vector<int32_t> text = {1, 2, 3}, table = {4};
  std::vector<DraftRequest> requests = {{text, 2, table, &sampled, 5, 0}};
  const DSparkBlockSet set = dspark_blocks(requests, 4, true, false);
  const std::vector<int32_t> words = encode_dspark_blocks(set);
  const DSparkBlockSet back = decode_dspark_blocks(words);
  ASSERT_EQ(back.blocks.size(), 1u);
  EXPECT_EQ(back.blocks[0].draw_uniforms.size(), 2u);
  EXPECT_THROW(decode_dspark_blocks(std::span(words).first(words.size() - 1)), Error);  // cut short
  std::vector<int32_t> longer = words;
  longer.push_back(0);
  EXPECT_THROW(decode_dspark_blocks(longer), Error);  // words left over
  std::vector<int32_t> negative = words;
  negative[0] = -1;
  EXPECT_THROW(decode_dspark_blocks(negative), Error);
  EXPECT_THROW(decode_dspark_drafts(std::vector<int32_t>{2, 0, 0}, 2), Error);
  EXPECT_THROW(decode_dspark_drafts(std::vector<int32_t>{1, 1, 5, 0, 2}, 1), Error);  // more rows than drafts
}

TEST(RemoteCopy, TheRunnerNeedsNodeZerosEndOfAChannelOfTwo) {
  RankWorkers nodes(3);
  std::vector<std::unique_ptr<ControlGroup>> groups = connect(nodes, "wide", std::chrono::seconds(5));
  EXPECT_THROW(RemoteCopyRunner(*groups[0], RemoteCopyGeometry{}), Error);
  EXPECT_THROW(RemoteCopyRunner(*groups[1], RemoteCopyGeometry{}), Error);
}

}  // namespace
}  // namespace m3
