#include "tests/kernels_cuda/msa_testing.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "formats/bf16.h"

namespace m3::cuda::testing {

void check(cudaError_t e, const char* what) {
  M3_CHECK(e == cudaSuccess, "CUDA error {} ({}) in {}", cudaGetErrorString(e), int(e), what);
}

DeviceMem::DeviceMem(size_t bytes) : bytes_(bytes) { MSA_CUDA(cudaMalloc(&ptr_, bytes)); }
DeviceMem& DeviceMem::operator=(DeviceMem&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}
DeviceMem::~DeviceMem() {
  if (ptr_) cudaFree(ptr_);
}

const char* page_layout_name(PageLayout layout) {
  switch (layout) {
    case PageLayout::kDisjoint: return "disjoint";
    case PageLayout::kPermuted: return "permuted";
    case PageLayout::kSharedPrefix: return "shared_prefix";
  }
  return "?";
}

BuiltStep build_step(const std::vector<SeqSpec>& seqs, int block_size, PageLayout layout,
                     int shared_prefix_blocks, std::mt19937_64& rng) {
  BuiltStep out;
  StepBatch& b = out.batch;
  const int S = static_cast<int>(seqs.size());
  int max_pages = 0;
  for (const SeqSpec& s : seqs) {
    M3_CHECK(s.q_len >= 1 && s.q_len <= s.seq_len, "bad sequence spec q_len {} seq_len {}", s.q_len, s.seq_len);
    max_pages = std::max(max_pages, (s.seq_len + block_size - 1) / block_size);
  }
  b.pages_per_seq = max_pages;
  b.page_table.assign(size_t(S) * max_pages, -1);
  const int shared = layout == PageLayout::kSharedPrefix ? shared_prefix_blocks : 0;
  int next = shared;
  for (int s = 0; s < S; ++s) {
    const int pages = (seqs[s].seq_len + block_size - 1) / block_size;
    if (shared) M3_CHECK(shared * block_size <= seqs[s].seq_len - seqs[s].q_len, "shared prefix must be history");
    for (int p = 0; p < pages; ++p) b.page_table[size_t(s) * max_pages + p] = p < shared ? p : next++;
  }
  out.num_blocks = next;
  if (layout == PageLayout::kPermuted) {
    std::vector<int> perm(next);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t& p : b.page_table)
      if (p >= 0) p = perm[p];
  }
  b.query_start.push_back(0);
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < seqs[s].q_len; ++i) {
      const int pos = seqs[s].seq_len - seqs[s].q_len + i;
      b.token_ids.push_back(0);
      b.positions.push_back(pos);
      b.token_seq.push_back(s);
      b.slot_mapping.push_back(b.page_table[size_t(s) * max_pages + pos / block_size] * block_size +
                               pos % block_size);
    }
    b.query_start.push_back(static_cast<int>(b.positions.size()));
    b.seq_lens.push_back(seqs[s].seq_len);
  }
  return out;
}

DeviceStep upload_step(const StepBatch& b) {
  DeviceStep d;
  d.positions = upload(b.positions);
  d.token_seq = upload(b.token_seq);
  d.seq_lens = upload(b.seq_lens);
  d.page_table = upload(b.page_table);
  d.slot_mapping = upload(b.slot_mapping);
  d.view.num_tokens = b.num_tokens();
  d.view.num_seqs = b.num_seqs();
  d.view.positions = d.positions.as<int32_t>();
  d.view.token_seq = d.token_seq.as<int32_t>();
  d.view.seq_lens = d.seq_lens.as<int32_t>();
  d.view.page_table = d.page_table.as<int32_t>();
  d.view.pages_per_seq = b.pages_per_seq;
  d.view.slot_mapping = d.slot_mapping.as<int32_t>();
  return d;
}

StepView host_view(const StepBatch& b) {
  StepView v;
  v.num_tokens = b.num_tokens();
  v.num_seqs = b.num_seqs();
  v.positions = b.positions.data();
  v.token_seq = b.token_seq.data();
  v.seq_lens = b.seq_lens.data();
  v.page_table = b.page_table.data();
  v.pages_per_seq = b.pages_per_seq;
  v.slot_mapping = b.slot_mapping.data();
  return v;
}

void random_bf16(std::mt19937_64& rng, size_t n, float stddev, std::vector<float>& values,
                 std::vector<uint16_t>& bits) {
  std::normal_distribution<float> dist(0.0f, stddev);
  values.resize(n);
  bits.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = bf16_encode(dist(rng));
    values[i] = bf16_decode(bits[i]);
  }
}

}  // namespace m3::cuda::testing
