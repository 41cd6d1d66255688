// Op cases: Backend::sample (the CUDA kernels of kernels/cuda/backend/sampling.cu against the
// reference, ops/sampling.h) on random bf16 logits rows: vocab 200064 and small ones; peaked, flat,
// heavily tied rows, rows with -inf and NaN entries, fully masked rows; every parameter (greedy,
// temperature, top_k, top_p, min_p, penalties, min_tokens mask) alone and mixed, several seeds and
// output indices. The ids must be identical, except where the reference's own trace shows one of
// its decisions (the draw, the top_p cut, a min_p test) within 1e-9 of the kept mass of a
// boundary: there the two sums' rounding order may pick the neighbour. Also: the same ids on a
// second run; in full mode the decode step of 128 rows at vocab 200064 (--perf times it). And the
// logprob rows beside the draw (LogprobsCase).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "formats/bf16.h"
#include "ops/sampling.h"
#include "tests/kernels_cuda/op_harness.h"

namespace m3::test {
namespace {

constexpr double kBoundary = 1e-9;
constexpr float kInf = std::numeric_limits<float>::infinity();

// kCrowded and kSpread are for the logprobs kernel's top k, which keeps the keys within a binade
// of the row's max when it can: kCrowded puts half the row in the max's binade and 40 logits
// near the max (too many kept: the chosen pivot is gathered again), kSpread spreads the row over
// six binades (at small vocabularies the top 20 reach past the first binade).
enum class RowShape { kPeaked, kFlat, kTied, kNegInf, kNaN, kAllMasked, kCrowded, kSpread };
const char* shape_name(RowShape s) {
  switch (s) {
    case RowShape::kPeaked: return "peaked";
    case RowShape::kFlat: return "flat";
    case RowShape::kTied: return "tied";
    case RowShape::kNegInf: return "-inf";
    case RowShape::kNaN: return "nan";
    case RowShape::kAllMasked: return "all -inf";
    case RowShape::kCrowded: return "crowded";
    case RowShape::kSpread: return "spread";
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
        case RowShape::kCrowded: x[i] = unit(rng) < 0.5f ? 1.0f + 0.9f * unit(rng) : 0.5f * normal(rng) - 4.0f; break;
        case RowShape::kSpread: x[i] = 100.0f * std::exp2(-6.0f * unit(rng)); break;
      }
      x[i] = bf16_round(x[i]);
    }
    if (shape == RowShape::kAllMasked && r % 2) x[rng() % vocab] = 1.0f;  // one survivor on odd rows
    if (shape == RowShape::kCrowded)
      for (int j = 0; j < 40; ++j) x[rng() % vocab] = bf16_round(1.95f + 0.04f * unit(rng));
    // A NaN last on the first row: at small vocabularies a GPU thread's whole share of the row
    // (seed 7 found a lone NaN dropped from the logprobs' sum).
    if (shape == RowShape::kNaN && r == 0) x[vocab - 1] = std::nanf("");
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
// ids overlapping the outputs, a few out of range, a logit bias on distinct ids: some masked, one
// of +-100).
void add_row(SampleBatch& batch, SampleRow row, bool lists, int vocab, std::mt19937_64& rng) {
  std::vector<int32_t> prompt, out_ids, out_counts, masked, bias_ids;
  std::vector<float> bias_values;
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
    const int n_bias = 1 + int(rng() % 40);
    for (int i = 0; i < n_bias; ++i) bias_ids.push_back(int32_t(rng() % vocab));
    bias_ids.push_back(out_ids[0]);  // masked too
    bias_ids.push_back(vocab + 7);   // outside: ignored
    std::sort(bias_ids.begin(), bias_ids.end());
    bias_ids.erase(std::unique(bias_ids.begin(), bias_ids.end()), bias_ids.end());
    std::uniform_real_distribution<float> bias(-5.0f, 5.0f);
    for (size_t i = 0; i < bias_ids.size(); ++i) bias_values.push_back(bias(rng));
    bias_values[rng() % bias_values.size()] = rng() % 2 ? 100.0f : -100.0f;
  }
  row.seed = rng();
  row.output_index = int32_t(rng() % 1000);
  // A third of the rows are constrained (structured outputs): about 1 token in 8 allowed.
  if (rng() % 3 == 0) {
    const int32_t words = (vocab + 31) / 32;
    row.allowed_row = batch.add_allowed_row(words);
    uint32_t* mask = batch.allowed.data() + size_t(row.allowed_row) * size_t(words);
    for (int32_t w = 0; w < words; ++w) mask[w] = uint32_t(rng() & rng() & rng());
    mask[0] |= 1u;  // never empty
  }
  batch.add(row, prompt.data(), int32_t(prompt.size()), out_ids.data(), out_counts.data(), int32_t(out_ids.size()),
            masked.data(), int32_t(masked.size()), bias_ids.data(), bias_values.data(), int32_t(bias_ids.size()));
}

// The geometry of the backends (sampling reads none of it).
Geometry sampling_geometry() { return {"sampling", 64, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32}; }

// Outputs: the ids of a first and of a second call (bytes, I32 per batch row).
class SampleCase : public OpCase {
 public:
  // Every parameter set of param_sets() (2 or 4 seeds each) over 6 logits rows of `shape`; or a
  // decode step: `rows` peaked rows sampled with `step_row` each.
  SampleCase(int vocab, RowShape shape, bool quick) : vocab_(vocab), shape_(shape), quick_(quick) {}
  SampleCase(int vocab, std::string step_name, SampleRow step_row, int rows)
      : vocab_(vocab), shape_(RowShape::kPeaked), quick_(false), step_name_(std::move(step_name)),
        step_row_(step_row), step_rows_(rows) {}

  std::string name() const override {
    if (step_rows_) return fmt::format("sample vocab {} step of {} rows {}", vocab_, step_rows_, step_name_);
    return fmt::format("sample vocab {} {}", vocab_, shape_name(shape_));
  }
  Geometry geometry() const override { return sampling_geometry(); }

  void build(std::mt19937_64& rng) override {
    logits_rows_ = step_rows_ ? step_rows_ : 6;
    logits_ = make_logits(rng, shape_, logits_rows_, vocab_);
    batch_.clear();
    if (step_rows_) {
      for (int r = 0; r < step_rows_; ++r) {
        SampleRow row = step_row_;
        row.logits_row = r;
        add_row(batch_, row, sample_row_penalised(step_row_), vocab_, rng);
      }
      return;
    }
    const int seeds = quick_ ? 2 : 4;
    for (const ParamSet& p : param_sets(quick_))
      for (int s = 0; s < seeds; ++s) {
        SampleRow row = p.row;
        row.logits_row = int32_t(batch_.rows.size() % logits_rows_);
        add_row(batch_, row, p.lists, vocab_, rng);
      }
  }

  BoundCase bind(Backend& b) const override {
    const Tensor logits = act_on_backend(b, logits_, logits_rows_, vocab_);
    Backend* be = &b;
    const SampleBatch* batch = &batch_;
    auto first = std::make_shared<std::vector<int32_t>>(batch_.rows.size(), -7);
    auto second = std::make_shared<std::vector<int32_t>>(batch_.rows.size(), -7);
    return {[=] {
              be->sample(logits, *batch, first->data(), nullptr);
              be->sample(logits, *batch, second->data(), nullptr);
            },
            [=] { return Outputs{ids_output(*first), ids_output(*second)}; }};
  }

  std::vector<Check> checks() const override {
    const std::string rows = fmt::format("({} rows)", batch_.rows.size());
    return {{rows + " ids vs reference", 0,
             [this](const Outputs& got, const Outputs& want) { return unexplained(got, want); }},
            self_differing(rows + " same ids on a second run", 0, 1)};
  }
  // Two calls per launch: the logits they read.
  double bytes() const override { return 2.0 * 2 * double(logits_rows_) * vocab_; }

 private:
  // Rows whose ids differ where the reference's trace shows no decision within kBoundary of a
  // boundary (or the id is out of range).
  double unexplained(const Outputs& got, const Outputs& want) const {
    const std::vector<int32_t> a = output_ids(got[0]), b = output_ids(want[0]);
    SampleWorkspace ws;
    int bad = 0;
    for (size_t i = 0; i < batch_.rows.size(); ++i) {
      if (a[i] == b[i]) continue;
      const SampleRow& r = batch_.rows[i];
      SampleTrace trace;
      sample_reference(logits_.data() + size_t(r.logits_row) * vocab_, vocab_, r, batch_, ws, &trace);
      const double margin = std::min({trace.draw_margin, trace.top_p_margin, trace.min_p_margin});
      bad += !(margin < kBoundary && a[i] >= 0 && a[i] < vocab_);
    }
    return bad;
  }

  int vocab_;
  RowShape shape_;
  bool quick_;
  std::string step_name_;
  SampleRow step_row_;
  int step_rows_ = 0;
  int logits_rows_ = 0;
  std::vector<float> logits_;
  SampleBatch batch_;
};

// Backend::sample's logprob rows beside a draw: every logits row of `shape` asked for the top 0, 1,
// 5 and 20 with literal tokens (and none), and rows asking about a row's draw and a draft (the
// speculative verification's rows). The CUDA logprobs against the reference's from the CUDA ids
// (a draw may differ at a boundary, SampleCase's business): the same tokens, ranks and top ids, and
// logprobs within 2e-5 (float exps against the reference's double ones).
// Outputs: ids, logprobs (RowLogprobs bytes).
class LogprobsCase : public OpCase {
 public:
  LogprobsCase(int vocab, RowShape shape, int rows) : vocab_(vocab), shape_(shape), rows_(rows) {}
  std::string name() const override { return fmt::format("logprobs vocab {} {} {} rows", vocab_, shape_name(shape_), rows_); }
  Geometry geometry() const override { return sampling_geometry(); }

  void build(std::mt19937_64& rng) override {
    logits_ = make_logits(rng, shape_, rows_, vocab_);
    batch_.clear();
    for (int r = 0; r < rows_; ++r) {  // a draw per logits row (T=1, lists on odd rows)
      SampleRow row;
      row.logits_row = r;
      add_row(batch_, row, r % 2 == 1, vocab_, rng);
    }
    for (int r = 0; r < rows_; ++r) {
      const auto token = [&] { return int32_t(rng() % vocab_); };
      for (int k : {0, 1, 5, kMaxTopLogprobs}) {
        LogprobRow q;
        q.logits_row = r;
        q.top_k = k;
        q.token[0] = k == 1 ? -1 : token();
        q.token[1] = k == 5 ? token() : -1;
        batch_.logprobs.push_back(q);
      }
      LogprobRow drawn;  // a verification row: its own draw and a draft
      drawn.logits_row = r;
      drawn.top_k = 3;
      drawn.drawn_by[0] = int32_t(rng() % batch_.rows.size());
      drawn.token[1] = token();
      batch_.logprobs.push_back(drawn);
    }
  }

  BoundCase bind(Backend& b) const override {
    const Tensor logits = act_on_backend(b, logits_, rows_, vocab_);
    Backend* be = &b;
    const SampleBatch* batch = &batch_;
    auto ids = std::make_shared<std::vector<int32_t>>(batch_.rows.size(), -7);
    auto lp = std::make_shared<std::vector<RowLogprobs>>(batch_.logprobs.size());
    return {[=] { be->sample(logits, *batch, ids->data(), lp->data()); },
            [=] {
              const auto* bytes = reinterpret_cast<const uint8_t*>(lp->data());
              return Outputs{ids_output(*ids), std::vector<uint8_t>(bytes, bytes + lp->size() * sizeof(RowLogprobs))};
            }};
  }

  std::vector<Check> checks() const override {
    return {{fmt::format("({} rows) tokens, ranks, top ids", batch_.logprobs.size()), 0,
             [this](const Outputs& got, const Outputs&) { return compare(got, false); }},
            {"logprobs", 2e-5, [this](const Outputs& got, const Outputs&) { return compare(got, true); }}};
  }
  double bytes() const override { return 2.0 * double(batch_.logprobs.size()) * vocab_; }

 private:
  // Mismatched ids (count) or, `values`, the largest logprob difference (NaN equal to NaN).
  double compare(const Outputs& got, bool values) const {
    const std::vector<int32_t> ids = output_ids(got[0]);
    std::vector<RowLogprobs> a(batch_.logprobs.size()), want(batch_.logprobs.size());
    if (got[1].bytes.size() != a.size() * sizeof(RowLogprobs)) return 1e9;
    std::memcpy(static_cast<void*>(a.data()), got[1].bytes.data(), got[1].bytes.size());
    logprobs_batch_reference(logits_.data(), rows_, vocab_, batch_, ids.data(), want.data());
    double worst = 0;
    const auto diff = [](float x, float y) {
      if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y) ? 0.0 : 1e9;
      if (x == y) return 0.0;  // equal infinities
      return std::abs(double(x) - double(y)) / std::max(1.0, std::abs(double(y)) * 1e-1);
    };
    for (size_t j = 0; j < a.size(); ++j) {
      const RowLogprobs &x = a[j], &y = want[j];
      if (values) {
        for (int t = 0; t < 2; ++t) worst = std::max(worst, diff(x.logprob[t], y.logprob[t]));
        for (int i = 0; i < std::min(x.num_top, y.num_top); ++i)
          worst = std::max(worst, diff(x.top_logprob[i], y.top_logprob[i]));
        continue;
      }
      bool same = x.num_top == y.num_top;
      for (int t = 0; t < 2; ++t) same = same && x.token[t] == y.token[t] && x.rank[t] == y.rank[t];
      for (int i = 0; same && i < y.num_top; ++i) same = x.top_id[i] == y.top_id[i];
      if (!same && worst == 0) {  // the first row that differs, for the log
        const auto show = [](const RowLogprobs& r) {
          std::string s = fmt::format("tokens {} {} ranks {} {} top", r.token[0], r.token[1], r.rank[0], r.rank[1]);
          for (int i = 0; i < std::min(r.num_top, kMaxTopLogprobs); ++i) s += fmt::format(" {}", r.top_id[i]);
          return s;
        };
        fmt::print("  {} row {} (top {}): got {}; want {}\n", name(), j, batch_.logprobs[j].top_k, show(x), show(y));
      }
      worst += !same;
    }
    return worst;
  }

  int vocab_;
  RowShape shape_;
  int rows_;
  std::vector<float> logits_;
  SampleBatch batch_;
};

}  // namespace

void add_sampling_cases(CaseList& cases, bool quick) {
  for (int vocab : {200064, 1000, 37, 3})
    for (RowShape shape : {RowShape::kPeaked, RowShape::kTied, RowShape::kNaN, RowShape::kAllMasked,
                           RowShape::kCrowded, RowShape::kSpread})
      if (!quick || shape == RowShape::kPeaked || vocab != 200064)
        cases.push_back(std::make_unique<LogprobsCase>(vocab, shape, 4));
  for (int vocab : {200064, 1000, 37, 3})
    for (RowShape shape : {RowShape::kPeaked, RowShape::kFlat, RowShape::kTied, RowShape::kNegInf, RowShape::kNaN,
                           RowShape::kAllMasked}) {
      if (quick && vocab == 200064 && shape != RowShape::kPeaked && shape != RowShape::kTied) continue;
      cases.push_back(std::make_unique<SampleCase>(vocab, shape, quick));
    }
  if (quick) return;
  // A decode step's sampling at batch 128 (--perf: its time against the logits it reads).
  SampleRow greedy, plain, typical, penalised;
  greedy.temperature = 0.0f;
  typical.temperature = 0.8f, typical.top_k = 50, typical.top_p = 0.95f;
  penalised = typical;
  penalised.repetition_penalty = 1.1f;
  for (const auto& [name, row] : {std::pair{"greedy", greedy}, std::pair{"T=1", plain},
                                  std::pair{"T=0.8 top_k=50 top_p=0.95", typical},
                                  std::pair{"same + repetition penalty", penalised}})
    cases.push_back(std::make_unique<SampleCase>(200064, name, row, 128));
  // A step of one request (the kernels' latency: one row on one cluster).
  for (const auto& [name, row] : {std::pair{"greedy", greedy}, std::pair{"T=1", plain},
                                  std::pair{"T=0.8 top_k=50 top_p=0.95", typical}})
    cases.push_back(std::make_unique<SampleCase>(200064, name, row, 1));
  cases.push_back(std::make_unique<LogprobsCase>(200064, RowShape::kPeaked, 1));
  // 32 draws and 160 logprob rows at vocab 200064 (--perf: the logits the logprob rows read).
  cases.push_back(std::make_unique<LogprobsCase>(200064, RowShape::kPeaked, 32));
}

}  // namespace m3::test
