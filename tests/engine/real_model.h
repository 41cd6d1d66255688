// Real MiniMax-M3 checkpoints under the engine, for the engine's end-to-end tests: a CPU model
// loaded from a directory, the same model seen through a smaller KV pool (forced preemption),
// a deterministic mixer for request contents.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "engine/engine_loop.h"
#include "engine/model_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/minimax_m3.h"
#include "model/weights.h"

namespace m3 {

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
};

inline Loaded load(const std::filesystem::path& dir, KvDType kv, int64_t num_blocks,
            DType activations = DType::kF32, int64_t host_blocks = 0) {
  Loaded m;
  m.backend = make_cpu_backend();
  ModelConfig config = load_model_config(dir);
  ModelWeights weights = load_weights(config, dir);
  ModelRuntimeOptions options;
  options.activation_dtype = activations;
  options.kv_dtype = kv;
  options.index_dtype = kv;
  options.num_kv_blocks = num_blocks;
  options.num_host_kv_blocks = host_blocks;
  m.model = std::make_unique<MiniMaxM3>(std::move(config), std::move(weights), *m.backend, options);
  return m;
}

// The same model seen through a smaller pool: forces preemption without reloading.
class SmallPoolRunner final : public ModelRunner {
 public:
  SmallPoolRunner(ModelRunner& inner, int64_t blocks) : inner_(inner), blocks_(blocks) {}
  int block_size() const override { return inner_.block_size(); }
  int64_t num_kv_blocks() const override { return blocks_; }
  int vocab_size() const override { return inner_.vocab_size(); }
  int64_t max_position_embeddings() const override { return inner_.max_position_embeddings(); }
  void forward(const StepBatch& b, float* logits) override { inner_.forward(b, logits); }
  int64_t num_host_kv_blocks() const override { return host_blocks_; }
  int64_t kv_block_bytes() const override { return inner_.kv_block_bytes(); }
  void copy_kv_blocks(const KvBlockCopies& copies) override { inner_.copy_kv_blocks(copies); }
  KvCopyTimes kv_copy_times() const override { return inner_.kv_copy_times(); }
  Drafter* drafter() override { return inner_.drafter(); }
  // The engine sees only the first `blocks` of the model's host slots (0: no host tier).
  SmallPoolRunner& with_host_blocks(int64_t blocks) {
    host_blocks_ = blocks;
    return *this;
  }

 private:
  int64_t host_blocks_ = 0;
  ModelRunner& inner_;
  int64_t blocks_;
};

inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Runs `reqs` through `loop` until it is idle: one request at a time, or (staggered) one more
// arriving before each step. add(request) hands a request to the loop with the caller's sink.
template <class Add>
void drive(EngineLoop& loop, const std::vector<EngineRequest>& reqs, bool one_at_a_time, Add&& add) {
  if (one_at_a_time) {
    for (const EngineRequest& r : reqs) {
      add(r);
      while (loop.has_work()) loop.step();
    }
    return;
  }
  std::size_t next = 0;
  for (int step = 0; next < reqs.size() || loop.has_work(); ++step) {
    while (next < reqs.size() && static_cast<int>(next) <= step) add(reqs[next++]);
    loop.step();
  }
}

inline const std::filesystem::path kSparse = "tests/model_golden/data/tiny-sparse-local2";
inline const std::filesystem::path kMixed = "tests/model_golden/data/tiny-mixed";

}  // namespace m3
