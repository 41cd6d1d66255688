#include "tests/model_golden/golden_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace m3::test {

LoadedModel load_model(const std::filesystem::path& dir, DType activations, KvDType kv,
                       KvDType index, int64_t num_blocks) {
  LoadedModel m;
  m.backend = make_cpu_backend();
  ModelConfig config = load_model_config(dir);
  ModelWeights weights = load_weights(config, dir);
  ModelRuntimeOptions options;
  options.activation_dtype = activations;
  options.kv_dtype = kv;
  options.index_dtype = index;
  options.num_kv_blocks = num_blocks;
  m.model = std::make_unique<MiniMaxM3>(std::move(config), std::move(weights), *m.backend, options);
  return m;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream f(path);
  M3_CHECK(f.good(), "cannot open {}", path.string());
  return nlohmann::json::parse(f);
}

std::vector<float> read_f32(const std::filesystem::path& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  M3_CHECK(f.good(), "cannot open {}", path.string());
  std::vector<float> v(count);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  M3_CHECK(f.gcount() == static_cast<std::streamsize>(count * sizeof(float)),
           "{}: expected {} floats", path.string(), count);
  return v;
}

std::vector<float> prefill_logits(MiniMaxM3& model, const std::vector<int32_t>& ids, int chunk) {
  const int vocab = model.config().vocab_size;
  SimpleKvAllocator kv(model.num_kv_blocks(), model.block_size());
  const int seq = kv.add_sequence();
  std::vector<float> out(ids.size() * vocab);
  for (size_t start = 0; start < ids.size(); start += chunk) {
    const size_t end = std::min(ids.size(), start + chunk);
    StepBatch b = kv.build_step({StepChunk{seq, {ids.begin() + start, ids.begin() + end}, true}});
    model.forward(b, out.data() + start * vocab);
  }
  return out;
}

std::vector<int32_t> greedy(MiniMaxM3& model, const std::vector<int32_t>& ids, int new_tokens) {
  const int vocab = model.config().vocab_size;
  SimpleKvAllocator kv(model.num_kv_blocks(), model.block_size());
  const int seq = kv.add_sequence();
  std::vector<float> logits(vocab);
  std::vector<int32_t> out;
  std::vector<int32_t> next = ids;
  for (int i = 0; i < new_tokens; ++i) {
    StepBatch b = kv.build_step({StepChunk{seq, next, false}});
    model.forward(b, logits.data());
    out.push_back(argmax(logits.data(), vocab));
    next = {out.back()};
  }
  return out;
}

double row_rel_error(const float* a, const float* b, int n) {
  double diff = 0, scale = 0;
  for (int i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

}  // namespace m3::test
