// The Gloo communicator on groups of 1-4 ranks in one process (a thread per rank, as
// `--device cpu -tp N` runs): every collective against values computed here, uneven all-to-all
// splits with empty parts, the shape errors, and RankWorkers' error propagation.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>

#include "core/error.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rank_workers.h"

namespace m3 {
namespace {

// A value every rank can compute for (rank, index): the expected results follow from it.
float value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + (i * 7919) % 997) * 0.25f; }

Tensor filled(int rank, int64_t n) {
  Tensor t = Tensor::zeros({n}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = value(rank, i);
  return t;
}

class GlooGroupTest : public ::testing::TestWithParam<int> {
 protected:
  // Runs body(comm) on every rank of a fresh group of GetParam() ranks.
  void on_group(const std::function<void(Communicator&)>& body) {
    const int n = GetParam();
    GlooRendezvous rendezvous = GlooRendezvous::in_process();
    RankWorkers workers(n);
    std::vector<std::unique_ptr<Communicator>> comms(n);
    workers.run([&](int r) { comms[r] = connect_gloo(rendezvous, r, n, "test"); });
    workers.run([&](int r) { body(*comms[r]); });
  }
};

TEST_P(GlooGroupTest, AllReduceSumAndMax) {
  const int n = GetParam();
  on_group([&](Communicator& comm) {
    EXPECT_EQ(comm.size(), n);
    EXPECT_EQ(comm.engine(), "gloo");
    Tensor x = filled(comm.rank(), 1000);
    comm.all_reduce(x, ReduceOp::kSum);
    for (int64_t i = 0; i < 1000; ++i) {
      float sum = 0;  // small integers times 0.25: exact in any order
      for (int r = 0; r < n; ++r) sum += value(r, i);
      ASSERT_EQ(x.data_as<float>()[i], sum) << "element " << i;
    }
    Tensor m = Tensor::zeros({5}, DType::kI32);
    for (int i = 0; i < 5; ++i) m.data_as<int32_t>()[i] = (comm.rank() * 3 + i) % n;
    comm.all_reduce(m, ReduceOp::kMax);
    for (int i = 0; i < 5; ++i) {
      int expected = 0;
      for (int r = 0; r < n; ++r) expected = std::max(expected, (r * 3 + i) % n);
      EXPECT_EQ(m.data_as<int32_t>()[i], expected);
    }
  });
}

TEST_P(GlooGroupTest, AllGatherReduceScatterBroadcast) {
  const int n = GetParam();
  on_group([&](Communicator& comm) {
    const int64_t part = 37;
    Tensor in = filled(comm.rank(), part);
    Tensor out = Tensor::zeros({n * part}, DType::kF32);
    comm.all_gather(in, out);
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < part; ++i) ASSERT_EQ(out.data_as<float>()[r * part + i], value(r, i));

    Tensor whole = filled(comm.rank(), n * part);
    Tensor mine = Tensor::zeros({part}, DType::kF32);
    comm.reduce_scatter(whole, mine);
    for (int64_t i = 0; i < part; ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += value(r, comm.rank() * part + i);
      ASSERT_EQ(mine.data_as<float>()[i], sum);
    }

    const int root = n - 1;
    Tensor b = filled(comm.rank(), 11);
    comm.broadcast(b, root);
    for (int64_t i = 0; i < 11; ++i) ASSERT_EQ(b.data_as<float>()[i], value(root, i));
    comm.barrier();
  });
}

// Rank s sends (s + d) % 3 rows of 4 floats to rank d (some parts empty), row values naming
// sender, receiver and row.
TEST_P(GlooGroupTest, AllToAllUnevenRows) {
  const int n = GetParam();
  auto rows = [](int s, int d) { return int64_t((s + d) % 3); };
  auto cell = [](int s, int d, int64_t row, int col) { return float(s * 1000 + d * 100 + row * 10 + col); };
  on_group([&](Communicator& comm) {
    const int me = comm.rank();
    std::vector<int64_t> send(n), recv(n);
    int64_t total_send = 0, total_recv = 0;
    for (int r = 0; r < n; ++r) {
      send[r] = rows(me, r);
      recv[r] = rows(r, me);
      total_send += send[r];
      total_recv += recv[r];
    }
    Tensor in = Tensor::zeros({std::max<int64_t>(total_send, 0), 4}, DType::kF32);
    int64_t at = 0;
    for (int d = 0; d < n; ++d)
      for (int64_t row = 0; row < send[d]; ++row, ++at)
        for (int c = 0; c < 4; ++c) in.data_as<float>()[at * 4 + c] = cell(me, d, row, c);
    Tensor out = Tensor::zeros({total_recv, 4}, DType::kF32);
    comm.all_to_all(in, send, out, recv);
    at = 0;
    for (int s = 0; s < n; ++s)
      for (int64_t row = 0; row < recv[s]; ++row, ++at)
        for (int c = 0; c < 4; ++c) ASSERT_EQ(out.data_as<float>()[at * 4 + c], cell(s, me, row, c));
  });
}

TEST_P(GlooGroupTest, ShapeErrorsNameTheCollective) {
  const int n = GetParam();
  on_group([&](Communicator& comm) {
    Tensor in = Tensor::zeros({4}, DType::kF32);
    Tensor wrong = Tensor::zeros({4 * n + 1}, DType::kF32);
    try {
      comm.all_gather(in, wrong);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gloo all_gather (group test, rank "), std::string::npos) << e.what();
    }
    Tensor b16 = Tensor::zeros({4}, DType::kBF16);
    EXPECT_THROW(comm.all_reduce(b16), Error);
    EXPECT_THROW(comm.all_to_all(in, std::vector<int64_t>(n + 1, 0), in, std::vector<int64_t>(n, 0)), Error);
    // The group still works after refused calls (nothing was sent).
    Tensor x = filled(comm.rank(), 3);
    comm.all_reduce(x);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooGroupTest, ::testing::Values(1, 2, 3, 4));

TEST(RankWorkers, RunsEveryRankAndRethrowsTheFirstError) {
  RankWorkers workers(3);
  std::atomic<int> sum{0};
  workers.run([&](int r) { sum += r + 1; });
  EXPECT_EQ(sum.load(), 6);
  try {
    workers.run([&](int r) {
      if (r >= 1) fail("rank {} broke", r);
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 broke"), std::string::npos) << e.what();
  }
  workers.run([&](int r) { sum += r; });  // still usable
  EXPECT_EQ(sum.load(), 9);
}

TEST(RankWorkers, StartHookErrorsSurfaceFromTheConstructor) {
  EXPECT_THROW(RankWorkers(2, [](int r) {
                 if (r == 1) fail("no device {}", r);
               }),
               Error);
}

// A peer that never arrives: the collective times out with a message instead of hanging.
TEST(GlooCommunicator, MissingPeerTimesOut) {
  GlooRendezvous rendezvous = GlooRendezvous::in_process();
  RankWorkers workers(2);
  std::vector<std::unique_ptr<Communicator>> comms(2);
  GlooOptions options;
  options.timeout = std::chrono::milliseconds(500);
  workers.run([&](int r) { comms[r] = connect_gloo(rendezvous, r, 2, "lonely", options); });
  try {
    workers.run([&](int r) {
      if (r == 0) {
        Tensor x = Tensor::zeros({8}, DType::kF32);
        comms[0]->all_reduce(x);
      }
    });
    ADD_FAILURE() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gloo all_reduce failed in group 'lonely'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace m3
