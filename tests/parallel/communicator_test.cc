// check_collective_shapes and check_all_to_all_rows (parallel/communicator.cc) on a stand-in
// communicator of 4 ranks: what they accept, and that each refusal names the engine, the
// collective, the group, the rank and the sizes.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

namespace m3 {
namespace {

// Only the identity matters to the checks; the collectives are never called.
class StandIn final : public Communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 4; }
  std::string_view engine() const override { return "test"; }
  const std::string& group_name() const override { return group_; }
  void all_reduce(Tensor, ReduceOp) override {}
  void all_gather(const Tensor&, Tensor) override {}
  void reduce_scatter(const Tensor&, Tensor) override {}
  void all_to_all(const Tensor&, const std::vector<int64_t>&, Tensor, const std::vector<int64_t>&) override {}
  void broadcast(Tensor, int) override {}
  void barrier() override {}

 private:
  std::string group_ = "tp";
};

// The message of the m3::Error `call` throws ("" when it throws none).
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << p << " not in: " << message;
}

TEST(CommunicatorShapes, AcceptsInPlaceAndDisjoint) {
  StandIn comm;
  Tensor x = Tensor::zeros({8, 3}, DType::kF32);
  Tensor out = Tensor::zeros({32, 3}, DType::kF32);
  EXPECT_NO_THROW(check_collective_shapes("all_reduce", comm, x, x, x.numel()));
  EXPECT_NO_THROW(check_collective_shapes("all_gather", comm, x, out, x.numel() * 4));
  EXPECT_NO_THROW(check_collective_shapes("reduce_scatter", comm, out, x, out.numel() / 4));
}

TEST(CommunicatorShapes, RefusesAWrongOutSize) {
  StandIn comm;
  Tensor in = Tensor::zeros({8}, DType::kBF16);
  Tensor out = Tensor::zeros({31}, DType::kBF16);
  expect_mentions(error_of([&] { check_collective_shapes("all_gather", comm, in, out, 32); }),
                  {"test all_gather", "group tp", "rank 1 of 4", "31 elements", "32 expected", "[8]"});
}

TEST(CommunicatorShapes, RefusesMixedDtypesAndOverlap) {
  StandIn comm;
  Tensor a = Tensor::zeros({8}, DType::kF32);
  Tensor b = Tensor::zeros({32}, DType::kBF16);
  expect_mentions(error_of([&] { check_collective_shapes("all_gather", comm, a, b, 32); }),
                  {"all_gather", "group tp", "F32", "BF16"});
  Tensor big = Tensor::zeros({33}, DType::kF32);
  expect_mentions(error_of([&] { check_collective_shapes("all_gather", comm, big.rows(1, 9), big.rows(0, 32), 32); }),
                  {"all_gather", "group tp", "overlap"});
}

TEST(CommunicatorShapes, EmptyTensorsNeedNoMemory) {
  StandIn comm;
  Tensor empty = Tensor::wrap(nullptr, {0, 5}, DType::kF32, Device::kCpu);
  EXPECT_NO_THROW(check_collective_shapes("all_gather", comm, empty, empty, 0));
  Tensor missing = Tensor::wrap(nullptr, {2, 5}, DType::kF32, Device::kCpu);
  expect_mentions(error_of([&] { check_collective_shapes("all_reduce", comm, missing, missing, 10); }),
                  {"all_reduce", "group tp", "no memory"});
}

TEST(CommunicatorRows, AcceptsUnevenSplitsWithZeros) {
  StandIn comm;
  Tensor in = Tensor::zeros({5, 7}, DType::kBF16);
  Tensor out = Tensor::zeros({3, 7}, DType::kBF16);
  Tensor none = Tensor::wrap(nullptr, {0, 7}, DType::kBF16, Device::kCpu);
  EXPECT_NO_THROW(check_all_to_all_rows(comm, in, {0, 2, 0, 3}, out, {1, 0, 2, 0}));
  EXPECT_NO_THROW(check_all_to_all_rows(comm, none, {0, 0, 0, 0}, none, {0, 0, 0, 0}));
}

TEST(CommunicatorRows, RefusesCountsThatDoNotMatch) {
  StandIn comm;
  Tensor in = Tensor::zeros({5, 7}, DType::kBF16);
  Tensor out = Tensor::zeros({3, 7}, DType::kBF16);
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, in, {1, 2, 0, 3}, out, {1, 0, 2, 0}); }),
                  {"test all_to_all", "group tp", "send_rows", "6 rows", "in has 5"});
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, in, {0, 2, 0, 3}, out, {1, 2}); }),
                  {"all_to_all", "recv_rows has 2 entries", "(4)"});
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, in, {0, 2, 4, -1}, out, {1, 0, 2, 0}); }),
                  {"all_to_all", "send_rows[3] = -1"});
  Tensor wide = Tensor::zeros({3, 8}, DType::kBF16);
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, in, {0, 2, 0, 3}, wide, {1, 0, 2, 0}); }),
                  {"all_to_all", "7 columns", "out has 8"});
  Tensor flat = Tensor::zeros({35}, DType::kBF16);
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, flat, {0, 2, 0, 3}, out, {1, 0, 2, 0}); }),
                  {"all_to_all", "2-D"});
}

TEST(CommunicatorRows, RefusesInPlace) {
  StandIn comm;
  Tensor x = Tensor::zeros({4, 2}, DType::kF32);
  expect_mentions(error_of([&] { check_all_to_all_rows(comm, x, {1, 1, 1, 1}, x, {1, 1, 1, 1}); }),
                  {"all_to_all", "group tp", "overlap"});
}

}  // namespace
}  // namespace m3
