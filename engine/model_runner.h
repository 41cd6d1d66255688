// What the engine needs from a model: its KV geometry and "forward a StepBatch, get logits" or,
// better, "forward a StepBatch, sample these rows, give me those logits rows".
// The engine owns block allocation (physical block ids in the StepBatch); the model owns the pool
// memory. MiniMaxM3 is adapted by engine/minimax_m3_runner.h; tests use small fakes.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "ops/kv_layout.h"
#include "ops/sampling.h"
#include "ops/step_batch.h"

namespace m3 {

class Drafter;  // engine/drafter.h

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual int block_size() const = 0;             // tokens per KV block (config index_block_size)
  virtual int64_t num_kv_blocks() const = 0;      // physical blocks in the pool: ids 0..n-1
  virtual int vocab_size() const = 0;             // logits row width
  virtual int64_t max_position_embeddings() const = 0;
  // Runs one step: writes the KV of every token of `batch` into its slot and fills
  // logits [batch.logits_rows.size(), vocab_size()] (fp32, row-major, raw). Must give the same
  // logits for a token whatever else is in the batch. May throw m3::Error; the engine then fails
  // the step's requests and keeps serving.
  virtual void forward(const StepBatch& batch, float* logits) = 0;
  // The step the engine runs: forward, then sampled_ids[i] for sampling.rows[i] and logprobs[j]
  // for sampling.logprobs[j] (ops/sampling.h; SampleRow::logits_row and LogprobRow::logits_row
  // index batch.logits_rows), and host_logits [host_rows.size(), vocab] holding the logits rows
  // host_rows (indices into batch.logits_rows) for the host's speculative verification. A device
  // runner samples where the logits are and copies only those rows. Default: forward() into a
  // host buffer and the reference (ops/sampling.h). Same contract on errors as forward().
  virtual void forward_sample(const StepBatch& batch, const SampleBatch& sampling, int32_t* sampled_ids,
                              RowLogprobs* logprobs, const std::vector<int32_t>& host_rows, float* host_logits);
  // Data-parallel lanes (EngineCore's second constructor): this lane's part of a step its peers
  // run while it has nothing scheduled (a model whose layers exchange with the other lanes' must
  // join every step). Default: nothing to join.
  virtual void idle_step() {}

  // The host tier of the prefix cache (--kv-offloading-size): slots of one pool block each in
  // host memory, ids 0..n-1. Default: 0, none.
  virtual int64_t num_host_kv_blocks() const { return 0; }
  // Bytes one block's copy moves (every rank's share of the block together).
  virtual int64_t kv_block_bytes() const { return 0; }
  // Before the next step: pool blocks -> host slots (to_host) and host slots -> pool blocks
  // (to_device), whole blocks (every layer's K, V and index-K with their scales). The next step
  // waits for the copies back, and for the copies to the host when copies.wait_for_saves (else
  // they overlap with it: ops/kv_layout.h KvBlockCopies); the caller does not wait. Each rank
  // copies its own bytes. Default: m3::Error (no host tier). Same contract on errors as forward().
  virtual void copy_kv_blocks(const KvBlockCopies& copies);
  // Seconds the copies took so far (those known to be done).
  virtual KvCopyTimes kv_copy_times() const { return {}; }
  // A drafter that reads the model's own state (DSpark: the target's hidden states, which each
  // forward hands it), owned by the runner; null when the runner has none.
  virtual Drafter* drafter() { return nullptr; }
};

}  // namespace m3
