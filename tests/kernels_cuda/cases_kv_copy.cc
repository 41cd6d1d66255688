// Op case: copy_kv_blocks (the host tier of the prefix cache) on CUDA (a copy stream into pinned
// memory) against the CPU's memcpy, over a real block layout (NVFP4 K, V and index-K with their
// scale rows, index-K on some layers only): three batches of blocks out to host slots (evicted
// now and saved ahead of eviction) and back into blocks, one of them a block saved in the same
// batch (its old bytes must reach the host before the new ones overwrite it), every host slot
// written.
#include <cstring>

#include <fmt/core.h>

#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

class KvCopyCase : public OpCase {
 public:
  explicit KvCopyCase(Geometry g) : g_(std::move(g)) {}
  std::string name() const override { return g_.name + " copy_kv_blocks nvfp4 out and back"; }
  Geometry geometry() const override { return g_; }

  void build(std::mt19937_64& rng) override {
    layout_ = KvLayout::make(g_.block_size, g_.kv_heads, g_.head_dim, g_.index_dim, KvDType::kNVFP4, KvDType::kNVFP4,
                             {true, false, true});
    pool_.resize(static_cast<size_t>(kBlocks * layout_.block_bytes));
    for (uint8_t& b : pool_) b = static_cast<uint8_t>(rng());
  }

  BoundCase bind(Backend& backend) const override {
    Tensor host_pool = Tensor::zeros({static_cast<int64_t>(pool_.size())}, DType::kU8);
    std::memcpy(host_pool.data(), pool_.data(), pool_.size());  // the CPU backend works in place
    Tensor pool = backend.to_device(host_pool, "KV pool");
    Tensor tier = backend.alloc_kv_host_tier(kSlots * layout_.block_bytes, "KV host tier");
    const int64_t bb = layout_.block_bytes;
    return {[&backend, pool, tier, bb] {
              // Batch 1 saves blocks evicted now and ahead; batch 2 restores from both kinds of
              // slots while saving another ahead; batch 3 saves block 7 and refills it at once.
              KvBlockCopies b1, b2, b3;
              b1.batch = 1, b1.to_host = {{3, 0}, {5, 1}}, b1.to_host_ahead = {{0, 2}, {11, 3}};
              b2.batch = 2, b2.to_device = {{5, 0}, {7, 2}}, b2.to_host_ahead = {{1, 1}}, b2.wait_for_batch = 1;
              b3.batch = 3, b3.to_host = {{7, 3}}, b3.to_device = {{7, 1}};
              for (const KvBlockCopies* b : {&b1, &b2, &b3}) backend.copy_kv_blocks(pool, tier, bb, *b);
            },
            [pool, tier] {
              // Reading a device pool synchronises the device (the copy stream too), so the host
              // tier is read after the copies into it.
              std::vector<uint8_t> pool_bytes = read_bytes(pool);
              return Outputs{std::move(pool_bytes), read_bytes(tier)};
            }};
  }

  std::vector<Check> checks() const override {
    return {bytes_differing("pool", 0, 0), bytes_differing("host tier", 1, 0)};
  }
  double bytes() const override { return 11.0 * layout_.block_bytes; }

 private:
  static constexpr int64_t kBlocks = 12, kSlots = 4;
  Geometry g_;
  KvLayout layout_;
  std::vector<uint8_t> pool_;
};

}  // namespace

void add_kv_copy_cases(CaseList& cases, bool /*quick*/) {
  for (const Geometry& g : {m3_geometry(), tiny_geometry()}) cases.push_back(std::make_unique<KvCopyCase>(g));
}

}  // namespace m3::test
