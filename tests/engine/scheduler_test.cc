#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include <fmt/core.h>

#include "engine/scheduler.h"

namespace m3 {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void make(int num_blocks, int block_size, int budget, int max_seqs, bool caching = false) {
    kv = std::make_unique<KvManager>(num_blocks, block_size, caching);
    SchedulerConfig config;
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = max_seqs;
    sched = std::make_unique<Scheduler>(config, *kv);
  }
  Sequence* add(int prompt_len, int first_token = 0) {
    auto s = std::make_unique<Sequence>();
    s->request.id = fmt::format("r{}", seqs.size());
    s->arrival_order = seqs.size();
    s->tokens.resize(prompt_len);
    std::iota(s->tokens.begin(), s->tokens.end(), first_token);
    s->num_prompt_tokens = prompt_len;
    kv->update_hashes(*s);
    sched->add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // What the engine does after a step: computed tokens advance, full blocks are registered, and
  // a request with everything computed gets one new token.
  void complete(const SchedulerOutput& out) {
    for (const ScheduledSeq& s : out.scheduled) {
      s.seq->num_computed_tokens += s.num_new_tokens;
      kv->commit_computed(*s.seq);
      if (s.seq->num_computed_tokens == s.seq->num_tokens()) {
        s.seq->tokens.push_back(7);
        kv->update_hashes(*s.seq);
      }
    }
  }
  static int tokens_of(const SchedulerOutput& out, const Sequence* seq) {
    for (const ScheduledSeq& s : out.scheduled) {
      if (s.seq == seq) return s.num_new_tokens;
    }
    return 0;
  }

  std::unique_ptr<KvManager> kv;
  std::unique_ptr<Scheduler> sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

TEST_F(SchedulerTest, ChunkedPrefillUnderTheTokenBudget) {
  make(64, 4, 8, 16);
  Sequence* a = add(10);
  Sequence* b = add(10);
  auto out = sched->schedule();
  EXPECT_EQ(out.num_tokens, 8);
  EXPECT_EQ(tokens_of(out, a), 8);
  EXPECT_EQ(tokens_of(out, b), 0);
  complete(out);
  out = sched->schedule();
  EXPECT_EQ(tokens_of(out, a), 2);  // the rest of a's prompt
  EXPECT_EQ(tokens_of(out, b), 6);  // then b's first chunk
  complete(out);
  out = sched->schedule();
  // a decodes (first), b finishes its prompt.
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
  EXPECT_EQ(tokens_of(out, b), 4);
  EXPECT_LE(out.num_tokens, 8);
}

TEST_F(SchedulerTest, WithoutChunkedPrefillAPromptRunsInOneStep) {
  kv = std::make_unique<KvManager>(64, 4, false);
  SchedulerConfig config;
  config.max_num_batched_tokens = 8;
  config.max_num_seqs = 16;
  config.enable_chunked_prefill = false;
  sched = std::make_unique<Scheduler>(config, *kv);
  Sequence* a = add(6);
  Sequence* b = add(6);
  Sequence* c = add(1);
  auto out = sched->schedule();
  EXPECT_EQ(tokens_of(out, a), 6);
  EXPECT_EQ(tokens_of(out, b), 0);  // 2 tokens left: b waits rather than run a chunk
  EXPECT_EQ(tokens_of(out, c), 0);  // FCFS: nobody overtakes b
  complete(out);
  out = sched->schedule();
  EXPECT_EQ(tokens_of(out, a), 1);
  EXPECT_EQ(tokens_of(out, b), 6);
  EXPECT_EQ(tokens_of(out, c), 1);
  EXPECT_EQ(out.num_tokens, 8);
}

TEST_F(SchedulerTest, DecodesGoBeforePrefillChunks) {
  make(64, 4, 4, 16);
  Sequence* a = add(3);
  complete(sched->schedule());  // a's prompt done
  Sequence* b = add(20);
  auto out = sched->schedule();  // a decodes, b gets the rest of the budget
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  EXPECT_EQ(tokens_of(out, b), 3);
  complete(out);
  out = sched->schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, a);  // older prefill b comes after the decode
  EXPECT_EQ(out.scheduled[1].seq, b);
}

TEST_F(SchedulerTest, MaxNumSeqsLimitsRunningRequests) {
  make(64, 4, 100, 2);
  add(3);
  add(3);
  Sequence* c = add(3);
  auto out = sched->schedule();
  EXPECT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(tokens_of(out, c), 0);
  EXPECT_EQ(sched->waiting().size(), 1u);
}

TEST_F(SchedulerTest, FcfsHeadOfLineIsNotOvertaken) {
  make(4, 4, 100, 8);  // 16 tokens of KV
  Sequence* a = add(12);
  complete(sched->schedule());  // a holds 3 blocks (13 tokens after its first output -> 4 next)
  Sequence* b = add(8);         // needs 2 blocks, only 1 free
  Sequence* c = add(2);         // would fit, but must not overtake b
  auto out = sched->schedule();
  EXPECT_EQ(tokens_of(out, a), 1);
  EXPECT_EQ(tokens_of(out, b), 0);
  EXPECT_EQ(tokens_of(out, c), 0);
  EXPECT_TRUE(b->block_table.empty());
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenBlocksRunOutAndRecomputesItLater) {
  make(4, 4, 100, 8);
  Sequence* a = add(6);  // 2 blocks
  Sequence* b = add(6);  // 2 blocks
  auto out = sched->schedule();
  EXPECT_EQ(out.scheduled.size(), 2u);
  complete(out);                // both hold 7 tokens, 6 computed
  complete(sched->schedule());  // 8 tokens, 7 computed
  complete(sched->schedule());  // 9 tokens, 8 computed: 2 full blocks each
  EXPECT_EQ(kv->pool().num_free(), 0);
  out = sched->schedule();  // a needs a third block: b (newest) is preempted
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b);
  EXPECT_EQ(tokens_of(out, a), 1);
  EXPECT_EQ(tokens_of(out, b), 0);
  EXPECT_EQ(b->status, SeqStatus::kWaiting);
  EXPECT_EQ(sched->waiting().front(), b);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_tokens(), 9);  // its output so far stays, to be recomputed
  EXPECT_EQ(sched->num_preemptions(), 1u);
  complete(out);
  // a finishes: b comes back and recomputes all 9 tokens as a prefill.
  sched->remove(a);
  out = sched->schedule();
  EXPECT_EQ(tokens_of(out, b), 9);
  kv->pool().check_invariants();
}

TEST_F(SchedulerTest, TheNewestRequestPreemptsItselfWhenItCannotGrow) {
  make(3, 4, 100, 8);
  Sequence* a = add(7);  // 2 blocks
  Sequence* b = add(4);  // 1 block
  complete(sched->schedule());  // a: 8 tokens (fits 2 blocks), b: 5 tokens (needs a 2nd block)
  auto out = sched->schedule();
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b);
  EXPECT_EQ(tokens_of(out, a), 1);
  EXPECT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(kv->pool().num_free(), 1);
  EXPECT_EQ(sched->waiting().front(), b);
}

TEST_F(SchedulerTest, RemoveFreesBlocksAtOnceFromRunningAndWaiting) {
  make(8, 4, 100, 8);
  Sequence* a = add(10);
  complete(sched->schedule());
  EXPECT_EQ(kv->pool().num_free(), 5);
  sched->remove(a);
  EXPECT_EQ(kv->pool().num_free(), 8);
  EXPECT_EQ(a->status, SeqStatus::kFinished);
  EXPECT_FALSE(sched->has_work());
  Sequence* b = add(3);
  sched->remove(b);
  EXPECT_TRUE(sched->waiting().empty());
}

TEST_F(SchedulerTest, PrefixCacheHitsSkipComputedBlocksAndAreCounted) {
  make(16, 4, 100, 8, true);
  Sequence* a = add(10);
  complete(sched->schedule());
  Sequence* b = add(10);  // same tokens 0..9: blocks 0 and 1 are cached
  auto out = sched->schedule();
  EXPECT_EQ(tokens_of(out, b), 2);
  EXPECT_EQ(b->num_cached_prompt_tokens, 8);
  EXPECT_EQ(b->block_table[0], a->block_table[0]);
  EXPECT_EQ(sched->prefix_cache_queries_tokens(), 20u);
  EXPECT_EQ(sched->prefix_cache_hits_tokens(), 8u);
  Sequence* c = add(9, 100);  // different tokens: miss
  out = sched->schedule();
  EXPECT_EQ(tokens_of(out, c), 9);
  EXPECT_EQ(c->num_cached_prompt_tokens, 0);
}

TEST_F(SchedulerTest, PromptLogprobsRequestsDoNotReadTheCacheAndChunkSmall) {
  make(64, 4, 1000, 8, true);
  add(10);
  complete(sched->schedule());
  Sequence* b = add(10);
  b->request.sampling.prompt_logprobs = 1;
  auto out = sched->schedule();
  EXPECT_EQ(b->num_cached_prompt_tokens, 0);
  EXPECT_EQ(tokens_of(out, b), 10);

  SchedulerConfig config;
  config.max_prompt_logprob_rows = 3;
  Scheduler small(config, *kv);
  Sequence c;
  c.request.id = "c";
  c.tokens.assign(10, 1);
  c.num_prompt_tokens = 10;
  c.request.sampling.prompt_logprobs = 0;
  small.add(&c);
  out = small.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 3);
  small.remove(&c);
}

}  // namespace
}  // namespace m3
