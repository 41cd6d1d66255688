// CUDA graphs (backend_check graphs): the same steps on a CUDA backend that launches every kernel
// (--enforce-eager) and on one that replays recorded decode steps (and speculative verification
// steps: 4 or 8 tokens a sequence) must give BITWISE identical logits and KV caches, since replay
// only re-launches the eager kernels with new metadata.
//
// Per model and KV dtype, both models see the same batches from one allocator:
//   1. chunked prefill of a few sequences (eager on both: not a uniform decode shape);
//   2. decode steps of the whole batch: the first runs eagerly, the second is recorded, the rest
//      replay it while every context grows, pages are added and some sequences cross into a new
//      page-table bucket (a new shape: recorded again);
//   3. a prefill of a new sequence in between, then decode with it (a new batch shape);
//   4. a batch larger than the model's activations (they move) and the backend's scratch hold,
//      which drops every graph; then the first batch again (recorded anew, replayed).
// Models: an M3-shaped one (head_dim = index_dim = 128, block 128: the MSA kernels, their graph
// mode bounds and device-side work counts; one full and one sparse layer, the M3.1 formats) and
// committed checkpoints (the generic attention kernels).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "model/config.h"
#include "tests/support/simple_kv_allocator.h"
#include "model/minimax_m3.h"
#include "model/weights.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/backend_testing.h"

namespace m3::test {
namespace {

struct Pair {
  std::unique_ptr<Backend> eager_backend, graph_backend;
  std::unique_ptr<MiniMaxM3> eager, graph;
};

Pair build_pair(const ModelConfig& config, const ModelWeights& weights, KvDType kv, KvDType index, int64_t blocks) {
  Pair p;
  ModelRuntimeOptions o;
  o.activation_dtype = DType::kBF16;
  o.kv_dtype = kv;
  o.index_dtype = index;
  o.num_kv_blocks = blocks;
  p.eager_backend = make_cuda_backend({.cuda_graphs = false});
  p.graph_backend = make_cuda_backend({.cuda_graphs = true});
  p.eager = std::make_unique<MiniMaxM3>(config, place_weights(weights, *p.eager_backend), *p.eager_backend, o);
  p.graph = std::make_unique<MiniMaxM3>(config, place_weights(weights, *p.graph_backend), *p.graph_backend, o);
  return p;
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// Runs steps on both models and counts the logits and KV bytes that differ.
class Driver {
 public:
  Driver(Pair& pair, const ModelConfig& config, int64_t blocks)
      : pair_(pair), vocab_(config.vocab_size), alloc_(blocks, config.index_block_size) {}

  int add_sequence(int prompt_len, int salt) {
    const int seq = alloc_.add_sequence();
    std::vector<int32_t> prompt(prompt_len);
    for (int i = 0; i < prompt_len; ++i) prompt[i] = int32_t((uint64_t(i + salt) * 2654435761u + 17) % vocab_);
    for (int start = 0; start < prompt_len; start += kChunk) {
      const int end = std::min(prompt_len, start + kChunk);
      step({StepChunk{seq, {prompt.begin() + start, prompt.begin() + end}, false}}, false);
    }
    next_.resize(std::max<size_t>(next_.size(), seq + 1));
    next_[seq] = argmax(logits_e_.data(), vocab_);
    return seq;
  }

  // One decode step of `seqs` (one token each, greedy along the eager model).
  void decode(const std::vector<int>& seqs) {
    std::vector<StepChunk> chunks;
    for (int s : seqs) chunks.push_back(StepChunk{s, {next_[s]}, false});
    step(chunks, true);
    for (size_t i = 0; i < seqs.size(); ++i) next_[seqs[i]] = argmax(logits_e_.data() + i * vocab_, vocab_);
  }

  // A speculative verification step of `seqs`: each its next token and q - 1 more (drafts), a
  // logits row for every token; the next token is the last row's greedy one.
  void verify(const std::vector<int>& seqs, int q) {
    std::vector<StepChunk> chunks;
    for (int s : seqs) {
      StepChunk c{s, {next_[s]}, true};
      for (int j = 1; j < q; ++j) c.tokens.push_back(int32_t((uint64_t(next_[s]) * 31 + j * 977) % vocab_));
      chunks.push_back(std::move(c));
    }
    step(chunks, true);
    for (size_t i = 0; i < seqs.size(); ++i)
      next_[seqs[i]] = argmax(logits_e_.data() + ((i + 1) * q - 1) * size_t(vocab_), vocab_);
  }

  int64_t logit_diffs() const { return logit_diffs_; }
  int64_t kv_diffs() const { return kv_diffs_; }
  int steps() const { return steps_; }

 private:
  // Prefill chunks no larger than the activations' 16-row minimum, so that the larger batch below
  // is the first step to move activations and scratch.
  static constexpr int kChunk = 16;

  void step(const std::vector<StepChunk>& chunks, bool compare_kv) {
    const StepBatch b = alloc_.build_step(chunks);
    const size_t n = b.logits_rows.size() * size_t(vocab_);
    logits_e_.assign(n, 0.0f);
    std::vector<float> logits_g(n, 1.0f);
    pair_.eager->forward(b, logits_e_.data());
    pair_.graph->forward(b, logits_g.data());
    for (size_t i = 0; i < n; ++i) logit_diffs_ += std::memcmp(&logits_e_[i], &logits_g[i], 4) != 0;
    ++steps_;
    if (!compare_kv) return;
    const std::vector<uint8_t> kv_e = read_bytes(pair_.eager->kv_pool()), kv_g = read_bytes(pair_.graph->kv_pool());
    for (size_t i = 0; i < kv_e.size(); ++i) kv_diffs_ += kv_e[i] != kv_g[i];
  }

  Pair& pair_;
  int vocab_;
  SimpleKvAllocator alloc_;
  std::vector<float> logits_e_;
  std::vector<int32_t> next_;
  int64_t logit_diffs_ = 0, kv_diffs_ = 0;
  int steps_ = 0;
};

// prompt_lens: the first batch (decoded together); the bucket crossings come from the lengths.
void check_replay(Report& rep, const std::string& name, const ModelConfig& config, const ModelWeights& weights,
                  KvDType kv, KvDType index, const std::vector<int>& prompt_lens, int decode_steps) {
  const std::string tag = fmt::format("graphs {} kv {} index {}", name, kv_dtype_name(kv), kv_dtype_name(index));
  try {
    const int bs = config.index_block_size;
    const int kBig = 20;  // > the model's 16-row activation minimum: they and the scratch move
    int64_t blocks = 0;
    for (int len : prompt_lens) blocks += (len + 3 * decode_steps + 64 + bs - 1) / bs + 1;
    blocks += int64_t(kBig) * ((3 * decode_steps + 80 + bs - 1) / bs + 1);  // the extra sequences
    Pair pair = build_pair(config, weights, kv, index, blocks);
    Driver d(pair, config, blocks);
    std::vector<int> batch;
    for (size_t i = 0; i < prompt_lens.size(); ++i) batch.push_back(d.add_sequence(prompt_lens[i], int(i) * 7919));
    for (int i = 0; i < decode_steps; ++i) d.decode(batch);
    const CudaGraphStats first = cuda_graph_stats(*pair.graph_backend);
    // Speculative verification steps (4 and 8 tokens a sequence): recorded and replayed like decode.
    for (int q : {4, 8})
      for (int i = 0; i < 4; ++i) d.verify(batch, q);
    const CudaGraphStats verified = cuda_graph_stats(*pair.graph_backend);

    // A prefill in between, then the batch with the new sequence.
    std::vector<int> grown = batch;
    grown.push_back(d.add_sequence(prompt_lens.front() / 2 + 3, 1234));
    for (int i = 0; i < decode_steps; ++i) d.decode(grown);

    // A larger batch (activations and scratch move: every graph is dropped), then the first batch.
    std::vector<int> big = grown;
    while (int(big.size()) < kBig) big.push_back(d.add_sequence(10 + 3 * int(big.size()), int(big.size())));
    for (int i = 0; i < 3; ++i) d.decode(big);
    const CudaGraphStats mid = cuda_graph_stats(*pair.graph_backend);
    for (int i = 0; i < decode_steps; ++i) d.decode(batch);
    const CudaGraphStats last = cuda_graph_stats(*pair.graph_backend);

    rep.note(fmt::format("{}: {} steps; graphs: {} eager, {} recorded, {} replayed, {} dropped, {} failed recordings "
                         "(after the first batch: {} recorded, {} replayed; after the verification steps: {} eager, {} "
                         "recorded, {} replayed, {} dropped; after the big batch: {} replayed, {} dropped)",
                         tag, d.steps(), last.eager, last.captures, last.replays, last.drops, last.capture_failures,
                         first.captures, first.replays, verified.eager, verified.captures, verified.replays,
                         verified.drops, mid.replays, mid.drops));
    rep.add(tag + " logits differing from --enforce-eager (bitwise)", double(d.logit_diffs()), 0.0);
    rep.add(tag + " KV pool bytes differing from --enforce-eager", double(d.kv_diffs()), 0.0);
    // The graphs must really have been used, also after the drop (replays after the big batch).
    const bool used = first.replays > 0 && verified.replays >= first.replays + 2 && mid.drops > 0 &&
                      last.replays > mid.replays && last.capture_failures == 0;
    rep.add(tag + " decode steps replayed from graphs (recorded, replayed, dropped and recorded again)",
            used ? 0.0 : 1.0, 0.0);
  } catch (const m3::Error& e) {
    rep.add(tag + " ERROR: " + e.what(), INFINITY, 0.0);
  }
}

// An M3-shaped model small enough to build in a moment: the M3.1 config (attention heads, head
// and index dims, block, top-k, formats) with a narrow hidden size, few experts and a small vocab;
// layer 0 full attention + dense MLP, layer 1 sparse + MoE.
ModelConfig m3_shaped_config(const std::string& m31_config_path) {
  std::ifstream f(m31_config_path);
  M3_CHECK(f.good(), "cannot open {}", m31_config_path);
  ModelConfig c = parse_model_config(nlohmann::json::parse(f), m31_config_path);
  override_num_layers(c, 2);
  c.attention_kinds = {AttentionKind::kFull, AttentionKind::kSparse};
  c.mlp_kinds = {MlpKind::kDense, MlpKind::kMoe};
  c.hidden_size = 512;
  c.vocab_size = 4096;
  c.num_experts = 16;
  c.moe_intermediate_size = 256;
  c.shared_intermediate_size = 256;
  c.dense_intermediate_size = 512;
  return c;
}

}  // namespace

void run_graph_checks(Report& rep, const std::string& m31_config_path, const std::vector<std::string>& model_dirs) {
  {
    const ModelConfig config = m3_shaped_config(m31_config_path);
    const ModelWeights weights = make_dummy_weights(config, 3);
    const int bs = config.index_block_size, topk = config.index_topk_blocks;
    // Around the top-k (no indexer items below it) and the 16-page bucket edge (2048 tokens):
    // contexts cross blocks and buckets while decoding.
    const std::vector<int> lens = {bs * topk - 5, bs * (topk + 1) - 3, bs * (topk + 3) + 50, 300};
    for (auto [kv, index] : {std::pair{KvDType::kNVFP4, KvDType::kNVFP4}, std::pair{KvDType::kBF16, KvDType::kFP8}})
      check_replay(rep, "m3-shaped", config, weights, kv, index, lens, 8);
  }
  for (const std::string& dir : model_dirs) {
    try {
      const ModelConfig config = load_model_config(dir);
      const ModelWeights weights = load_weights(config, dir);
      const int bs = config.index_block_size, topk = std::max(1, config.index_topk_blocks);
      // Beyond the top-k and past the 16-page bucket edge for the small blocks of these models.
      const std::vector<int> lens = {bs * topk + 5, bs * 16 - 4, bs * 16 + 9};
      const std::string name = std::filesystem::path(dir).filename().string();
      for (auto [kv, index] : {std::pair{KvDType::kBF16, KvDType::kBF16}, std::pair{KvDType::kF32, KvDType::kF32}})
        check_replay(rep, name, config, weights, kv, index, lens, 8);
    } catch (const m3::Error& e) {
      rep.add("graphs " + dir + " ERROR: " + e.what(), INFINITY, 0.0);
    }
  }
}

}  // namespace m3::test
