// Whole-model checks of the CUDA backend on the committed checkpoints: the same MiniMaxM3 graph on
// the CPU reference (bf16 activations) and on the GPU, for every KV dtype. Per model and dtype,
// over a chunked prefill and 16 decode steps teacher-forced along the CPU's greedy continuation:
// the row error max |gpu - cpu| / max |cpu| (prefill mean and decode median, worst reported) and
// the argmax agreement on the rows whose CPU top-2 margin exceeds 1e-3 of the row's scale (over
// prefill rows and decode steps together; the decode flips are reported). Per model and dtype, the
// same statistics of the reference against itself with a one-rounding-step perturbation are the
// yardstick of how far that model and cache amplify such a difference, and each gate is
// max(fixed bound, 2 x yardstick): row errors 0.05, disagreement 5%. A trained model's quantized
// caches amplify more than a random one's (a one-step difference before an FP4 rounding moves the
// code by a whole FP4 step), which the fixed bounds alone would call a GPU error.
//
// Why statistical gates: the two backends differ only where an fp32 sum lands on the other side of
// a bf16 rounding boundary (backend_ops: every op within one bf16 step), but these random
// tiny models turn such a one-step difference into a different discrete decision now and then (an
// MoE top-k or an indexer block selection near a tie), and that token's row then changes
// completely, here and in what later tokens read from its K/V. tests/model_golden makes the same
// call for quantized KV caches. A wrong op moves every row: mean error near 1, agreement near
// 1/vocab.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "model/config.h"
#include "tests/support/simple_kv_allocator.h"
#include "model/minimax_m3.h"
#include "model/weights.h"
#include "tests/kernels_cuda/backend_checks.h"

namespace m3::test {
namespace {

constexpr double kMeanRowTolerance = 0.05;  // mean over rows of the row error
constexpr double kMinAgreement = 0.95;      // argmax agreement on rows with a margin > 1e-3
constexpr double kMarginThreshold = 1e-3;
constexpr int kGreedyTokens = 16;
constexpr double kYardstickFactor = 2.0;  // a gate is max(fixed bound, this x the yardstick)
constexpr int kChunk = 48;

struct Run {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MiniMaxM3> model;
};

Run build(const ModelConfig& config, const ModelWeights& weights, bool gpu, KvDType kv, KvDType index,
          int64_t blocks) {
  Run r;
  r.backend = gpu ? make_cuda_backend() : make_cpu_backend();
  ModelRuntimeOptions o;
  o.activation_dtype = DType::kBF16;
  o.kv_dtype = kv;
  o.index_dtype = index;
  o.num_kv_blocks = blocks;
  r.model = std::make_unique<MiniMaxM3>(config, place_weights(weights, *r.backend), *r.backend, o);
  return r;
}

struct Top2 {
  int id;
  double margin;  // (top1 - top2) / max |logit|
};
Top2 top2(const float* x, int n) {
  int a = 0, b = -1;
  double scale = 0;
  for (int i = 0; i < n; ++i) {
    scale = std::max(scale, std::fabs(double(x[i])));
    if (i == a) continue;
    if (x[i] > x[a]) {
      b = a;
      a = i;
    } else if (b < 0 || x[i] > x[b]) {
      b = i;
    }
  }
  return {a, b < 0 ? 1.0 : (double(x[a]) - x[b]) / std::max(scale, 1e-30)};
}

// max |got - want| / max |want| of one row.
double row_error(const float* got, const float* want, int n) {
  double diff = 0, scale = 0;
  for (int v = 0; v < n; ++v) {
    const double d = std::fabs(double(got[v]) - want[v]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(double(want[v])));
  }
  return diff / std::max(scale, 1e-30);
}

// Row errors, rows decided (reference top-2 margin > 1e-3) and how many of those agree.
struct Stats {
  std::vector<double> errors;
  int worst_row = 0, decided = 0, agree = 0;
  void add(const float* got, const float* want, int n, int row) {
    const double e = row_error(got, want, n);
    if (errors.empty() || e > *std::max_element(errors.begin(), errors.end())) worst_row = row;
    errors.push_back(e);
    const Top2 r = top2(want, n), g = top2(got, n);
    if (r.margin > kMarginThreshold) {
      ++decided;
      agree += r.id == g.id;
    }
  }
  double mean() const {
    double s = 0;
    for (double e : errors) s += e;
    return errors.empty() ? 0.0 : s / errors.size();
  }
  double median() const {
    std::vector<double> e = errors;
    std::sort(e.begin(), e.end());
    return e.empty() ? 0.0 : e[e.size() / 2];
  }
  std::string summary() const {
    return fmt::format("row error mean {:.2e} median {:.2e} worst {:.2e} (row {}); argmax differs on {} of {} rows with "
                       "margin > 1e-3", mean(), median(), errors.empty() ? 0.0 : *std::max_element(errors.begin(), errors.end()),
                       worst_row, decided - agree, decided);
  }
};

// The reference's own sensitivity, as a yardstick for the GPU's differences: the weights with
// layer 0's input norm factors (1 + w) scaled by 1 + 2^-12, which moves roughly one in 16 of that
// norm's bf16 outputs by one rounding step, about what another fp32 summation order does.
ModelWeights perturbed(const ModelWeights& w) {
  ModelWeights p = w;  // tensors shared, but the one replaced
  const Tensor& src = w.layers.at(0).input_norm;
  M3_CHECK(src.dtype() == DType::kF32, "layer 0 input norm is {}, expected F32", dtype_name(src.dtype()));
  Tensor n = Tensor::zeros(src.shape(), DType::kF32);
  for (int64_t i = 0; i < n.numel(); ++i)
    n.data_as<float>()[i] = (1.0f + src.data_as<const float>()[i]) * (1.0f + 0x1p-12f) - 1.0f;
  p.layers[0].input_norm = n;
  return p;
}

void check_model(Report& rep, const std::string& dir, bool quick) {
  ModelConfig config = load_model_config(dir);
  const ModelWeights weights = load_weights(config, dir);
  const int bs = config.index_block_size;
  // Long enough for the indexer to choose (beyond topk blocks), within the model's limits.
  int len = std::min<int>(bs * (config.index_topk_blocks + 2) + 37, quick ? 400 : 2400);
  len = static_cast<int>(std::min<long>(len, config.max_position_embeddings - kGreedyTokens - 1));
  std::vector<int32_t> prompt(len);
  for (int i = 0; i < len; ++i) prompt[i] = int32_t((uint64_t(i) * 2654435761u + 17) % config.vocab_size);
  const int64_t blocks = (len + kGreedyTokens + bs - 1) / bs + 2;
  const std::vector<std::pair<KvDType, KvDType>> dtypes =
      quick ? std::vector<std::pair<KvDType, KvDType>>{{KvDType::kBF16, KvDType::kBF16}, {KvDType::kNVFP4, KvDType::kNVFP4}}
            : std::vector<std::pair<KvDType, KvDType>>{{KvDType::kF32, KvDType::kF32},
                                                       {KvDType::kBF16, KvDType::kBF16},
                                                       {KvDType::kFP8, KvDType::kFP8},
                                                       {KvDType::kNVFP4, KvDType::kNVFP4},
                                                       {KvDType::kNVFP4, KvDType::kFP8}};
  const std::string name = std::filesystem::path(dir).filename().string();
  for (const auto& [kv, index] : dtypes) {
    const std::string tag = fmt::format("model {} kv {} index {} ({} tokens)", name, kv_dtype_name(kv),
                                        kv_dtype_name(index), len);
    try {
      Run cpu = build(config, weights, false, kv, index, blocks);
      Run gpu = build(config, weights, true, kv, index, blocks);
      // The yardstick: the reference against itself, perturbed.
      Run yard = build(config, perturbed(weights), false, kv, index, blocks);
      std::vector<float> ly(size_t(kChunk) * config.vocab_size);
      // One allocator drives both models: the same batches, the same pages.
      SimpleKvAllocator alloc(blocks, bs);
      const int seq = alloc.add_sequence();
      const int vocab = config.vocab_size;
      std::vector<float> lc(size_t(kChunk) * vocab), lg(size_t(kChunk) * vocab);
      Stats prefill, decode, yard_prefill, yard_decode;
      for (int start = 0; start < len; start += kChunk) {
        const int end = std::min(len, start + kChunk);
        const StepBatch b = alloc.build_step({StepChunk{seq, {prompt.begin() + start, prompt.begin() + end}, true}});
        cpu.model->forward(b, lc.data());
        gpu.model->forward(b, lg.data());
        yard.model->forward(b, ly.data());
        for (int r = 0; r < end - start; ++r) {
          prefill.add(lg.data() + size_t(r) * vocab, lc.data() + size_t(r) * vocab, vocab, start + r);
          yard_prefill.add(ly.data() + size_t(r) * vocab, lc.data() + size_t(r) * vocab, vocab, start + r);
        }
      }
      // Greedy continuation of the CPU, the GPU teacher-forced along it.
      int32_t next = top2(lc.data() + size_t((len - 1) % kChunk) * vocab, vocab).id;
      for (int i = 0; i < kGreedyTokens; ++i) {
        const StepBatch b = alloc.build_step({StepChunk{seq, {next}, false}});
        cpu.model->forward(b, lc.data());
        gpu.model->forward(b, lg.data());
        decode.add(lg.data(), lc.data(), vocab, len + i);
        yard.model->forward(b, ly.data());
        yard_decode.add(ly.data(), lc.data(), vocab, len + i);
        next = top2(lc.data(), vocab).id;
      }
      rep.note(tag + " prefill: " + prefill.summary());
      rep.note(tag + " decode (teacher-forced greedy): " + decode.summary());
      rep.note(tag + " yardstick prefill, the reference against itself with layer 0's norm moved by 2^-12: " +
               yard_prefill.summary());
      rep.note(tag + " yardstick decode: " + yard_decode.summary());
      const auto disagreement = [](const Stats& a, const Stats& b) {
        const int decided = a.decided + b.decided, agree = a.agree + b.agree;
        return decided ? 1.0 - double(agree) / decided : 0.0;
      };
      const auto gate = [](double fixed, double yardstick) { return std::max(fixed, kYardstickFactor * yardstick); };
      rep.add(tag + " prefill mean row error", prefill.mean(), gate(kMeanRowTolerance, yard_prefill.mean()));
      rep.add(tag + " decode median row error", decode.median(), gate(kMeanRowTolerance, yard_decode.median()));
      rep.add(tag + fmt::format(" argmax disagreement on decided rows (prefill + greedy decode; {} of {} decode "
                                "steps differ)", decode.decided - decode.agree, decode.decided),
              disagreement(prefill, decode), gate(1.0 - kMinAgreement, disagreement(yard_prefill, yard_decode)));
    } catch (const Error& e) {
      rep.add(tag + " ERROR: " + e.what(), INFINITY, 0.0);
    }
  }
}

}  // namespace

void run_model_checks(Report& rep, const std::vector<std::string>& model_dirs, bool quick) {
  for (const std::string& dir : model_dirs) {
    try {
      check_model(rep, dir, quick);
    } catch (const Error& e) {
      rep.add("model " + dir + " ERROR: " + e.what(), INFINITY, 0.0);
    }
  }
}

}  // namespace m3::test
