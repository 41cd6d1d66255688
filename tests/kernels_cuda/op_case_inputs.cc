#include "tests/kernels_cuda/op_case_inputs.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"
#include "kernels/cpu/attention.h"

namespace m3::test {

Geometry m3_geometry() { return {"m3", 512, 32, 2, 128, 2, 128, 128, 16, 1, 0, 64}; }
Geometry tiny_geometry() { return {"tiny", 64, 4, 2, 64, 2, 32, 16, 4, 2, 1, 32}; }

Step make_step(const std::vector<SeqSpec>& seqs, int block_size, PageLayout layout, int shared_prefix_blocks,
               int vocab, std::mt19937_64& rng) {
  cuda::testing::BuiltStep built = cuda::testing::build_step(seqs, block_size, layout, shared_prefix_blocks, rng);
  Step s{std::move(built.batch), built.num_blocks};
  for (int32_t& id : s.batch.token_ids) id = int32_t(rng() % uint64_t(vocab));
  for (int q = 1; q <= s.batch.num_seqs(); ++q) s.batch.logits_rows.push_back(s.batch.query_start[q] - 1);
  return s;
}

Tensor encode_pool(const KvLayout& layout, const StepBatch& b, int num_blocks, bool with_step_tokens,
                   std::mt19937_64& rng) {
  Tensor pool = Tensor::zeros({layout.block_bytes * num_blocks}, DType::kU8);
  std::memset(pool.data(), 0x5a, pool.nbytes());
  const KvLayerView cache = layout.layer_view(pool.data_as<uint8_t>(), 0);
  std::vector<int32_t> slots;
  for (int s = 0; s < b.num_seqs(); ++s) {
    const int q_len = b.query_start[s + 1] - b.query_start[s];
    const int filled = with_step_tokens ? b.seq_lens[s] : b.seq_lens[s] - q_len;
    for (int p = 0; p < filled; ++p)
      slots.push_back(b.page_table[size_t(s) * b.pages_per_seq + p / layout.block_size] * layout.block_size +
                      p % layout.block_size);
  }
  // Shared prefix pages appear once per sequence: encode each slot once.
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  StepView fill;
  fill.num_tokens = static_cast<int>(slots.size());
  fill.slot_mapping = slots.data();
  const size_t kv_cols = size_t(layout.num_kv_heads) * layout.head_dim;
  const std::vector<float> k = random_values(rng, slots.size() * kv_cols, 1.0f);
  const std::vector<float> v = random_values(rng, slots.size() * kv_cols, 1.0f);
  const std::vector<float> ik = random_values(rng, slots.size() * layout.index_dim, 1.0f);
  cpu_kv_insert(fill, cache, k.data(), v.data(), layout.index_dim ? ik.data() : nullptr);
  return pool;
}

Tensor random_selection(const StepBatch& b, int block_size, int heads, int topk, std::mt19937_64& rng) {
  const int t_count = b.num_tokens();
  Tensor sel = Tensor::zeros({int64_t(t_count) * heads * topk}, DType::kI32);
  int32_t* out = sel.data_as<int32_t>();
  for (int t = 0; t < t_count; ++t) {
    const int own = b.positions[t] / block_size;
    for (int h = 0; h < heads; ++h) {
      std::set<int32_t> picked{own};
      const int want = std::min(topk, own + 1);
      while (int(picked.size()) < want) picked.insert(int32_t(rng() % uint64_t(own + 1)));
      int32_t* row = out + (size_t(t) * heads + h) * topk;
      std::fill(row, row + topk, -1);
      std::copy(picked.begin(), picked.end(), row);
    }
  }
  return sel;
}

std::vector<bool> decode_tokens(const StepBatch& b) {
  std::vector<bool> decode(b.num_tokens());
  for (int t = 0; t < b.num_tokens(); ++t) {
    const int s = b.token_seq[t];
    decode[t] = b.query_start[s + 1] - b.query_start[s] <= 16;
  }
  return decode;
}

}  // namespace m3::test
