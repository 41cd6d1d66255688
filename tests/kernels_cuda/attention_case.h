// The attention-side op cases (kv_insert, attention_input, indexer_topk, paged_attention sparse
// and dense) over one step and one KV pool: the host inputs and the binding to a backend, shared
// by the op-check geometries (cases_attention.cc) and the MSA kernel cases (cases_msa.cc), which
// differ in their steps and in how they measure.
#pragma once
#include <string>
#include <vector>

#include "ops/kv_layout.h"
#include "tests/kernels_cuda/op_case_inputs.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {

enum class AttentionOp { kInput, kInsert, kIndexer, kSparse, kDense };
const char* attention_op_name(AttentionOp op);

struct AttentionSetup {
  Geometry geometry;  // heads, KV heads, dims, block size, indexer parameters
  KvDType kv_dtype = KvDType::kBF16, index_dtype = KvDType::kBF16;
  std::vector<SeqSpec> seqs;
  PageLayout layout = PageLayout::kDisjoint;
  int shared_prefix_blocks = 0;
};

// Outputs: kInput: q, k, index_k (values), the pool (bytes), index_q (values); kInsert: the pool; kIndexer: the
// selection (bytes, I32 [T, Hi, topk]); kSparse, kDense: the attention output (values).
class AttentionCase : public OpCase {
 public:
  AttentionCase(std::string name, AttentionSetup setup, AttentionOp op)
      : name_(std::move(name)), s_(std::move(setup)), op_(op) {}
  std::string name() const override { return name_; }
  Geometry geometry() const override { return s_.geometry; }
  void build(std::mt19937_64& rng) override;
  BoundCase bind(Backend& backend) const override;
  double bytes() const override;
  double flops() const override;

 protected:
  IndexerParams indexer() const;
  int tokens() const { return step_.batch.num_tokens(); }

  std::string name_;
  AttentionSetup s_;
  AttentionOp op_;
  // Host inputs.
  Step step_;
  KvLayout layout_;
  Tensor pool_;  // kInput, kInsert: history only; else every slot up to seq_len
  std::vector<float> q_, k_, v_, index_k_, index_q_;
  Tensor q_norm_, k_norm_, index_k_norm_, index_q_norm_, selection_;
};

}  // namespace m3::test
