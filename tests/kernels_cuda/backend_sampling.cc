// backend_check group `sampling`: Backend::sample on the GPU (kernels/cuda/backend/sampling.cu)
// against the reference (ops/sampling.h) on random bf16 logits rows: vocab 200064 and small ones;
// peaked, flat, heavily tied rows, rows with -inf and NaN entries, fully masked rows; every
// parameter (greedy, temperature, top_k, top_p, min_p, penalties, min_tokens mask) alone and mixed,
// several seeds and output indices. The ids must be identical, except where the reference's own
// trace shows one of its decisions (the draw, the top_p cut, a min_p test) within 1e-9 of the kept
// mass of a boundary: there the two sums' rounding order may pick the neighbour. Also: the GPU gives
// the same ids on a second run, and the time of a 128-row step against the logits copy it replaces.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/core.h>

#include "core/error.h"
#include "formats/bf16.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "ops/sampling.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/backend_testing.h"

namespace m3::test {
namespace {

constexpr double kBoundary = 1e-9;
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class RowShape { kPeaked, kFlat, kTied, kNegInf, kNaN, kAllMasked };
const char* shape_name(RowShape s) {
  switch (s) {
    case RowShape::kPeaked: return "peaked";
    case RowShape::kFlat: return "flat";
    case RowShape::kTied: return "tied";
    case RowShape::kNegInf: return "-inf";
    case RowShape::kNaN: return "nan";
    case RowShape::kAllMasked: return "all -inf";
  }
  return "?";
}

// bf16-exact values (what the GPU reads), row-major [rows, vocab].
std::vector<float> make_logits(std::mt19937_64& rng, RowShape shape, int rows, int vocab) {
  std::vector<float> v(size_t(rows) * vocab);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int r = 0; r < rows; ++r) {
    float* x = v.data() + size_t(r) * vocab;
    for (int i = 0; i < vocab; ++i) {
      switch (shape) {
        case RowShape::kPeaked: x[i] = 3.0f * normal(rng) + (unit(rng) < 0.001f ? 12.0f : 0.0f); break;
        case RowShape::kFlat: x[i] = 0.05f * normal(rng); break;
        case RowShape::kTied: x[i] = std::floor(3.0f * unit(rng)) * 0.5f; break;  // three values
        case RowShape::kNegInf: x[i] = unit(rng) < 0.3f ? -kInf : 2.0f * normal(rng); break;
        case RowShape::kNaN: x[i] = unit(rng) < 0.01f ? std::nanf("") : 2.0f * normal(rng); break;
        case RowShape::kAllMasked: x[i] = -kInf; break;
      }
      x[i] = bf16_round(x[i]);
    }
    if (shape == RowShape::kAllMasked && r % 2) x[rng() % vocab] = 1.0f;  // one survivor on odd rows
  }
  return v;
}

struct ParamSet {
  std::string name;
  SampleRow row;
  bool lists = false;  // penalty and mask lists
};

std::vector<ParamSet> param_sets(bool quick) {
  std::vector<ParamSet> out;
  auto add = [&](std::string name, auto set, bool lists = false) {
    ParamSet p;
    p.name = std::move(name);
    set(p.row);
    p.lists = lists;
    out.push_back(p);
  };
  add("greedy", [](SampleRow& r) { r.temperature = 0.0f; });
  add("greedy+penalties+mask", [](SampleRow& r) { r.temperature = 0.0f, r.repetition_penalty = 1.5f,
                                                  r.frequency_penalty = 0.5f; }, true);
  for (float t : {0.5f, 1.0f, 1.7f}) add(fmt::format("T={}", t), [t](SampleRow& r) { r.temperature = t; });
  for (int k : {1, 5, 50, 1000}) add(fmt::format("top_k={}", k), [k](SampleRow& r) { r.top_k = k; });
  for (float p : {0.1f, 0.5f, 0.95f}) add(fmt::format("top_p={}", p), [p](SampleRow& r) { r.top_p = p; });
  for (float m : {0.05f, 0.5f}) add(fmt::format("min_p={}", m), [m](SampleRow& r) { r.min_p = m; });
  add("penalties", [](SampleRow& r) { r.repetition_penalty = 1.3f, r.frequency_penalty = 0.7f,
                                      r.presence_penalty = -0.4f; }, true);
  add("T=0.8 top_k=40 top_p=0.9", [](SampleRow& r) { r.temperature = 0.8f, r.top_k = 40, r.top_p = 0.9f; });
  add("top_p=0.7 min_p=0.02", [](SampleRow& r) { r.top_p = 0.7f, r.min_p = 0.02f; });
  add("T=1.2 top_k=200 top_p=0.5 min_p=0.1 +lists",
      [](SampleRow& r) { r.temperature = 1.2f, r.top_k = 200, r.top_p = 0.5f, r.min_p = 0.1f,
                         r.repetition_penalty = 0.8f, r.presence_penalty = 1.0f; }, true);
  add("top_p=0.99 +mask", [](SampleRow& r) { r.top_p = 0.99f; }, true);
  if (quick) out.resize(std::min<size_t>(out.size(), 12));
  return out;
}

// Appends `row` with random lists (prompt set sorted unique, distinct outputs with counts, masked
// ids overlapping the outputs, a few out of range).
void add_row(SampleBatch& batch, SampleRow row, bool lists, int vocab, std::mt19937_64& rng) {
  std::vector<int32_t> prompt, out_ids, out_counts, masked;
  if (lists) {
    const int n_prompt = 1 + int(rng() % std::min(3000, vocab));
    for (int i = 0; i < n_prompt; ++i) prompt.push_back(int32_t(rng() % vocab));
    prompt.push_back(-1);
    std::sort(prompt.begin(), prompt.end());
    prompt.erase(std::unique(prompt.begin(), prompt.end()), prompt.end());
    const int n_out = 1 + int(rng() % std::min(200, vocab));
    for (int i = 0; i < n_out; ++i) out_ids.push_back(int32_t(rng() % vocab));
    std::sort(out_ids.begin(), out_ids.end());
    out_ids.erase(std::unique(out_ids.begin(), out_ids.end()), out_ids.end());
    std::shuffle(out_ids.begin(), out_ids.end(), rng);
    for (size_t i = 0; i < out_ids.size(); ++i) out_counts.push_back(1 + int32_t(rng() % 5));
    masked = {out_ids[0], out_ids[0], int32_t(rng() % vocab), vocab + 3};
  }
  row.seed = rng();
  row.output_index = int32_t(rng() % 1000);
  batch.add(row, prompt.data(), int32_t(prompt.size()), out_ids.data(), out_counts.data(), int32_t(out_ids.size()),
            masked.data(), int32_t(masked.size()));
}

std::vector<int32_t> gpu_sample(Backend& gpu, const Tensor& logits, const SampleBatch& batch) {
  std::vector<int32_t> ids(batch.rows.size(), -7);
  gpu.sample(logits, batch, ids.data());
  return ids;
}

void check_case(Report& rep, Backend& gpu, std::mt19937_64& rng, int vocab, RowShape shape, bool quick) {
  const int logits_rows = 6;
  const std::vector<float> host = make_logits(rng, shape, logits_rows, vocab);
  const Tensor logits = device_act(host, logits_rows, vocab);
  SampleBatch batch;
  const int seeds = quick ? 2 : 4;
  for (const ParamSet& p : param_sets(quick))
    for (int s = 0; s < seeds; ++s) {
      SampleRow row = p.row;
      row.logits_row = int32_t(batch.rows.size() % logits_rows);
      add_row(batch, row, p.lists, vocab, rng);
    }
  const std::vector<int32_t> got = gpu_sample(gpu, logits, batch);
  const std::vector<int32_t> again = gpu_sample(gpu, logits, batch);
  SampleWorkspace ws;
  int unexplained = 0, boundary = 0, nondeterministic = 0;
  std::string first_bad;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    const SampleRow& r = batch.rows[i];
    SampleTrace trace;
    const int32_t want =
        sample_reference(host.data() + size_t(r.logits_row) * vocab, vocab, r, batch, ws, &trace);
    nondeterministic += got[i] != again[i];
    if (got[i] == want) continue;
    const double margin = std::min({trace.draw_margin, trace.top_p_margin, trace.min_p_margin});
    if (margin < kBoundary && got[i] >= 0 && got[i] < vocab) {
      ++boundary;
      continue;
    }
    if (unexplained++ == 0)
      first_bad = fmt::format("row {} (T {} top_k {} top_p {} min_p {}): gpu {} cpu {} margin {:.2e}", i,
                              r.temperature, r.top_k, r.top_p, r.min_p, got[i], want, margin);
  }
  const std::string name = fmt::format("sampling vocab {} {} ({} rows)", vocab, shape_name(shape), batch.rows.size());
  rep.add(name + " ids vs reference", unexplained, 0);
  rep.add(name + " same ids on a second run", nondeterministic, 0);
  if (boundary) rep.note(fmt::format("{}: {} id(s) differ at a boundary within {:.0e}", name, boundary, kBoundary));
  if (!first_bad.empty()) rep.note(first_bad);
}

// A decode step's sampling at batch 128 against the copy of its logits rows that it replaces.
void time_step(Report& rep, Backend& gpu, std::mt19937_64& rng) {
  const int vocab = 200064, rows = 128;
  const std::vector<float> host = make_logits(rng, RowShape::kPeaked, rows, vocab);
  const Tensor logits = device_act(host, rows, vocab);
  std::vector<float> copy(size_t(rows) * vocab);
  auto time_ms = [&](const std::function<void()>& f) {
    f();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  };
  const double copy_ms = time_ms([&] { gpu.copy_to_host_f32(logits, copy.data()); });
  rep.note(fmt::format("batch {} vocab {}: logits copy to host {:.3f} ms", rows, vocab, copy_ms));
  struct Timed {
    const char* name;
    SampleRow row;
  };
  SampleRow greedy, plain, typical, penalised;
  greedy.temperature = 0.0f;
  typical.temperature = 0.8f, typical.top_k = 50, typical.top_p = 0.95f;
  penalised = typical;
  penalised.repetition_penalty = 1.1f;
  for (const Timed& t : {Timed{"greedy", greedy}, Timed{"T=1", plain}, Timed{"T=0.8 top_k=50 top_p=0.95", typical},
                         Timed{"same + repetition penalty", penalised}}) {
    SampleBatch batch;
    for (int r = 0; r < rows; ++r) {
      SampleRow row = t.row;
      row.logits_row = r;
      add_row(batch, row, t.row.repetition_penalty != 1.0f, vocab, rng);
    }
    std::vector<int32_t> ids(rows);
    const double ms = time_ms([&] { gpu.sample(logits, batch, ids.data()); });
    rep.note(fmt::format("batch {} vocab {}: sample {:<28} {:.3f} ms (ids only come back)", rows, vocab, t.name, ms));
  }
}

}  // namespace

void run_sampling_checks(Report& rep, bool quick, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 3);
  auto gpu = make_cuda_backend(false);
  for (int vocab : {200064, 1000, 37, 3})
    for (RowShape shape : {RowShape::kPeaked, RowShape::kFlat, RowShape::kTied, RowShape::kNegInf, RowShape::kNaN,
                           RowShape::kAllMasked}) {
      if (quick && vocab == 200064 && shape != RowShape::kPeaked && shape != RowShape::kTied) continue;
      check_case(rep, *gpu, rng, vocab, shape, quick);
    }
  time_step(rep, *gpu, rng);
}

}  // namespace m3::test
