// The control group (parallel/control_group.h) with in-process Gloo ranks standing in for the
// nodes' processes: node 0's steps reach every follower in order and stop ends their loop (from
// the destructor), the host tier's KV copies arrive between the steps they were sent between,
// heartbeats keep an idle node 0 alive past the timeout, a silent node 0 is
// reported lost within a bounded time, and min_over_nodes.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/control_group.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rank_workers.h"

namespace m3 {
namespace {

using std::chrono::milliseconds;

StepBatch step(int i) {
  StepBatch b;
  b.token_ids = {i, i + 1};
  b.positions = {i, i};
  b.token_seq = {0, 1};
  b.query_start = {0, 1, 2};
  b.seq_lens = {i + 1, i + 1};
  b.pages_per_seq = 1;
  b.page_table = {0, 1};
  b.slot_mapping = {i, 128 + i};
  b.logits_rows = {0, 1};
  return b;
}

// One ControlGroup per "node" (a thread each), connected with `timeout`.
std::vector<std::unique_ptr<ControlGroup>> connect_nodes(RankWorkers& nodes, milliseconds timeout) {
  const int n = nodes.size();
  GlooRendezvous rendezvous = GlooRendezvous::in_process();
  std::vector<std::unique_ptr<ControlGroup>> groups(n);
  GlooOptions options;
  options.timeout = timeout;
  nodes.run([&](int r) {
    groups[r] = std::make_unique<ControlGroup>(connect_gloo(rendezvous, r, n, "control", options), timeout);
  });
  return groups;
}

TEST(ControlGroup, FollowersRunNodeZerosStepsInOrderUntilStop) {
  RankWorkers nodes(3);
  auto groups = connect_nodes(nodes, milliseconds(10000));
  EXPECT_TRUE(groups[0]->leader());
  EXPECT_FALSE(groups[1]->leader());
  std::vector<std::vector<StepBatch>> seen(3);
  std::vector<std::vector<KvBlockCopies>> copies_seen(3);
  std::vector<size_t> copies_before_step(3);
  nodes.run([&](int r) {
    EXPECT_EQ(groups[r]->min_over_nodes(100 - 10 * r), 80);
    groups[r]->barrier();
    if (r == 0) {
      groups[0]->start_heartbeat();
      for (int i = 0; i < 5; ++i) groups[0]->announce(i % 2 ? StepKind::kForwardSample : StepKind::kForward, step(i));
      groups[0]->announce(StepKind::kForward, StepBatch{});  // an empty step is a step too
      KvBlockCopies copies;
      copies.batch = 1;
      copies.to_device = {{4, 2}};
      groups[0]->announce_kv_copies(copies);
      groups[0]->announce(StepKind::kForwardSample, step(7));
      groups[0].reset();  // the destructor says stop
    } else {
      while (std::optional<NodeCommand> c = groups[r]->next_command()) {
        if (c->kind == StepKind::kCopyKvBlocks) {
          copies_seen[r].push_back(c->copies);
          copies_before_step[r] = seen[r].size();
        } else {
          seen[r].push_back(c->step);
        }
      }
    }
  });
  for (int r = 1; r < 3; ++r) {
    ASSERT_EQ(seen[r].size(), 7u) << "node " << r;
    ASSERT_EQ(copies_seen[r].size(), 1u) << "node " << r;
    EXPECT_EQ(copies_before_step[r], 6u) << "the copies arrive between the steps they were sent between";
    ASSERT_EQ(copies_seen[r][0].to_device.size(), 1u);
    EXPECT_EQ(copies_seen[r][0].to_device[0].block, 4);
    EXPECT_EQ(copies_seen[r][0].to_device[0].host_slot, 2);
    EXPECT_EQ(seen[r][6].token_ids, step(7).token_ids);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(seen[r][i].token_ids, step(i).token_ids);
      EXPECT_EQ(seen[r][i].slot_mapping, step(i).slot_mapping);
      EXPECT_EQ(seen[r][i].pages_per_seq, 1);
    }
    EXPECT_EQ(seen[r][5].num_tokens(), 0);
  }
}

TEST(ControlGroup, HeartbeatsKeepAnIdleNodeZeroAlivePastTheTimeout) {
  RankWorkers nodes(2);
  auto groups = connect_nodes(nodes, milliseconds(400));
  int steps = 0;
  nodes.run([&](int r) {
    if (r == 0) {
      groups[0]->start_heartbeat();
      std::this_thread::sleep_for(milliseconds(1500));  // idle for several timeouts
      groups[0]->announce(StepKind::kForward, step(3));
      groups[0]->stop();
      groups[0]->stop();  // once
    } else {
      while (groups[1]->next_command()) ++steps;
    }
  });
  EXPECT_EQ(steps, 1);
}

TEST(ControlGroup, ASilentNodeZeroIsReportedLost) {
  RankWorkers nodes(2);
  auto groups = connect_nodes(nodes, milliseconds(500));
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  nodes.run([&](int r) {
    if (r == 0) {
      std::this_thread::sleep_for(milliseconds(1500));  // loaded, but never heartbeats nor steps
      return;
    }
    try {
      groups[1]->next_command();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(5000));
  EXPECT_NE(error.find("node 1: lost node 0"), std::string::npos) << error;
  EXPECT_NE(error.find("control group within 500 ms"), std::string::npos) << error;
  groups.clear();  // node 0 never started heartbeats, so its destructor sends no stop
}

TEST(ControlGroup, OnlyNodeZeroAnnouncesAndOnlyFollowersWait) {
  RankWorkers nodes(2);
  auto groups = connect_nodes(nodes, milliseconds(2000));
  EXPECT_THROW(groups[1]->announce(StepKind::kForward, step(0)), Error);
  EXPECT_THROW(groups[0]->next_command(), Error);
  EXPECT_THROW(groups[0]->announce(StepKind::kStop, step(0)), Error);
  EXPECT_THROW(groups[1]->announce_kv_copies(KvBlockCopies{}), Error);
}

}  // namespace
}  // namespace m3
