// Helpers of the golden tests: load a committed checkpoint, run prompts through MiniMaxM3 with
// SimpleKvAllocator, read the recorded reference outputs.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/simple_kv_allocator.h"
#include "model/minimax_m3.h"
#include "ops/backend.h"

namespace m3::test {

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
};

LoadedModel load_model(const std::filesystem::path& dir, DType activations = DType::kF32,
                       KvDType kv = KvDType::kF32, KvDType index = KvDType::kF32,
                       int64_t num_blocks = 256);

nlohmann::json read_json(const std::filesystem::path& path);
std::vector<float> read_f32(const std::filesystem::path& path, size_t count);

// Logits [rows, vocab] of every position of `ids`, fed in chunks of at most `chunk` tokens.
std::vector<float> prefill_logits(MiniMaxM3& model, const std::vector<int32_t>& ids, int chunk);
// Greedy continuation of `ids` (prefill then one-token decode steps).
std::vector<int32_t> greedy(MiniMaxM3& model, const std::vector<int32_t>& ids, int new_tokens);

// max |a - b| / max |b| of one row.
double row_rel_error(const float* a, const float* b, int n);
int argmax(const float* x, int n);

}  // namespace m3::test
