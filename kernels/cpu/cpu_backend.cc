// The CPU reference backend: every op of ops/backend.h, exact, on host memory.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "formats/bf16.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/host_copy_rate.h"
#include "ops/draft_heads.h"

namespace m3 {
namespace {

using cpu::round_act;

// Gemma RMSNorm of one row in the reference's order: (x * rsqrt(mean(x^2) + eps)) * (1 + w).
void rms_norm_row(const float* x, const float* w, int n, float eps, bool bf16, float* y) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) y[i] = round_act((x[i] * r) * (1.0f + w[i]), bf16);
}

void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  M3_CHECK(t.defined() && t.dtype() == DType::kF32 && t.ndim() == 2 && t.dim(0) == rows &&
               t.dim(1) == cols,
           "cpu backend: {} must be F32 [{}, {}], got {} {}", what, rows, cols,
           t.defined() ? dtype_name(t.dtype()) : "undefined", shape_string(t.shape()));
}

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }

  void configure(const BackendConfig& config) override {
    M3_CHECK(config.activation_dtype == DType::kF32 || config.activation_dtype == DType::kBF16,
             "cpu backend: activations must be float32 or bfloat16, not {}", dtype_name(config.activation_dtype));
    M3_CHECK(config.rotary_dim % 2 == 0 && config.rotary_dim <= config.head_dim &&
                 static_cast<int>(config.rope_inv_freq.size()) * 2 >= config.rotary_dim,
             "cpu backend: rotary_dim {} needs {} inverse frequencies (have {})", config.rotary_dim,
             config.rotary_dim / 2, config.rope_inv_freq.size());
    config_ = config;
    bf16_ = config.activation_dtype == DType::kBF16;
  }
  DType activation_dtype() const override { return bf16_ ? DType::kBF16 : DType::kF32; }
  DType activation_storage_dtype() const override { return DType::kF32; }

  Tensor alloc(Shape shape, DType dtype) override { return Tensor::zeros(std::move(shape), dtype); }
  Tensor to_device(const Tensor& host, std::string_view) override { return host; }
  void copy_to_host_f32(const Tensor& src, float* dst) override {
    M3_CHECK(src.dtype() == DType::kF32, "cpu backend: copy_to_host_f32 of {}", dtype_name(src.dtype()));
    std::memcpy(dst, src.data(), src.nbytes());
  }

  void plan(const StepBatch& batch) override {
    batch_ = &batch;
    view_ = host_step_view(batch);
    // cos/sin as MiniMaxM3VLRotaryEmbedding: freqs = pos * inv_freq in fp32, concat(freqs, freqs),
    // times attention_factor, cast to the activation dtype.
    const int rd = config_.rotary_dim, half = rd / 2;
    const float factor = config_.rope_attention_factor;
    cos_.resize(size_t(view_.num_tokens) * rd);
    sin_.resize(size_t(view_.num_tokens) * rd);
    for (int t = 0; t < view_.num_tokens; ++t) {
      for (int i = 0; i < half; ++i) {
        const float f = static_cast<float>(batch.positions[t]) * config_.rope_inv_freq[i];
        const float c = round_act(std::cos(f) * factor, bf16_);
        const float s = round_act(std::sin(f) * factor, bf16_);
        cos_[size_t(t) * rd + i] = cos_[size_t(t) * rd + half + i] = c;
        sin_[size_t(t) * rd + i] = sin_[size_t(t) * rd + half + i] = s;
      }
    }
  }
  StepView planned_step() const override { return view_; }

  void embed(const Tensor& table, int64_t first_id, Tensor out) override {
    const int64_t hidden = table.dim(1), rows = table.dim(0);
    check_rows(out, view_.num_tokens, hidden, "embed output");
    for (int t = 0; t < view_.num_tokens; ++t) {
      const int64_t id = int64_t(batch_->token_ids[t]) - first_id;
      float* y = out.data_as<float>() + int64_t(t) * hidden;
      if (id < 0 || id >= rows) {
        std::fill(y, y + hidden, 0.0f);
        continue;
      }
      if (table.dtype() == DType::kBF16) {
        const uint16_t* row = table.data_as<const uint16_t>() + int64_t(id) * hidden;
        for (int64_t c = 0; c < hidden; ++c) y[c] = bf16_decode(row[c]);
      } else {
        M3_CHECK(table.dtype() == DType::kF32, "embedding table of dtype {} is not supported",
                 dtype_name(table.dtype()));
        const float* row = table.data_as<const float>() + int64_t(id) * hidden;
        for (int64_t c = 0; c < hidden; ++c) y[c] = round_act(row[c], bf16_);
      }
    }
  }

  void concat_column_parts(const Tensor& parts, int num_parts, Tensor out) override {
    M3_CHECK(num_parts >= 1 && parts.dim(0) % num_parts == 0, "concat_column_parts: {} rows do not split in {} parts",
             parts.dim(0), num_parts);
    const int64_t rows = parts.dim(0) / num_parts, w = parts.dim(1), cols = out.dim(1);
    check_rows(out, rows, cols, "concat_column_parts output");
    M3_CHECK(cols <= num_parts * w, "concat_column_parts: {} columns from {} parts of {}", cols, num_parts, w);
    for (int p = 0; p < num_parts; ++p) {
      const int64_t width = std::min(w, cols - p * w);
      for (int64_t r = 0; width > 0 && r < rows; ++r)
        std::copy_n(parts.data_as<const float>() + (p * rows + r) * w, width, out.data_as<float>() + r * cols + p * w);
    }
  }

  void gather_logits_rows(const Tensor& x, Tensor out) override {
    const int64_t cols = x.dim(1);
    const auto& rows = batch_->logits_rows;
    check_rows(out, static_cast<int64_t>(rows.size()), cols, "gathered rows");
    for (size_t r = 0; r < rows.size(); ++r)
      std::memcpy(out.data_as<float>() + r * cols, x.data_as<const float>() + rows[r] * cols,
                  sizeof(float) * cols);
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    const int64_t rows = x.dim(0), cols = x.dim(1);
    check_rows(out, rows, cols, "rms_norm output");
    M3_CHECK(weight.dtype() == DType::kF32 && weight.numel() == cols,
             "rms_norm weight must be F32 [{}]", cols);
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 16))
    for (int64_t r = 0; r < rows; ++r)
      rms_norm_row(x.data_as<const float>() + r * cols, weight.data_as<const float>(),
                   static_cast<int>(cols), eps, bf16_, out.data_as<float>() + r * cols);
  }

  void linear(const Tensor& x, const LinearWeight& weight, Tensor out) override {
    check_rows(x, x.dim(0), weight.in_features, ("input of " + weight.name).c_str());
    check_rows(out, x.dim(0), weight.out_features, ("output of " + weight.name).c_str());
    cpu::linear(x.data_as<const float>(), x.dim(0), weight, out.data_as<float>(), bf16_, scratch_);
  }

  void head_norm_rope(Tensor x, int num_heads, int head_dim, const Tensor& norm, float eps,
                      int rope_dims) override {
    check_rows(x, view_.num_tokens, int64_t(num_heads) * head_dim, "head_norm_rope input");
    M3_CHECK(norm.dtype() == DType::kF32 && norm.numel() == head_dim,
             "head norm weight must be F32 [{}]", head_dim);
    M3_CHECK(rope_dims % 2 == 0 && rope_dims <= head_dim && rope_dims <= config_.rotary_dim,
             "rope over {} channels of {} (rotary_dim {})", rope_dims, head_dim,
             config_.rotary_dim);
    const int rd = config_.rotary_dim, half = rope_dims / 2;
#pragma omp parallel for schedule(static) if (int64_t(view_.num_tokens) * num_heads * head_dim >= (1 << 16))
    for (int t = 0; t < view_.num_tokens; ++t) {
      const float* cs = cos_.data() + size_t(t) * rd;
      const float* sn = sin_.data() + size_t(t) * rd;
      for (int h = 0; h < num_heads; ++h) {
        float* v = x.data_as<float>() + (int64_t(t) * num_heads + h) * head_dim;
        rms_norm_row(v, norm.data_as<const float>(), head_dim, eps, bf16_, v);
        for (int c = 0; c < half; ++c) {
          const float a = v[c], b = v[c + half];
          v[c] = round_act(round_act(a * cs[c], bf16_) + round_act(-b * sn[c], bf16_), bf16_);
          v[c + half] = round_act(
              round_act(b * cs[c + half], bf16_) + round_act(a * sn[c + half], bf16_), bf16_);
        }
      }
    }
  }

  void kv_insert(const KvLayerView& cache, const Tensor& k, const Tensor& v,
                 const Tensor& index_k) override {
    const int64_t kv_cols = int64_t(cache.num_kv_heads) * cache.head_dim;
    check_rows(k, view_.num_tokens, kv_cols, "K");
    check_rows(v, view_.num_tokens, kv_cols, "V");
    if (index_k.defined()) check_rows(index_k, view_.num_tokens, cache.index_dim, "index K");
    cpu_kv_insert(view_, cache, k.data_as<const float>(), v.data_as<const float>(),
                  index_k.defined() ? index_k.data_as<const float>() : nullptr);
  }

  void indexer_topk(const KvLayerView& cache, const Tensor& index_q, const IndexerParams& params,
                    Tensor selection) override {
    check_rows(index_q, view_.num_tokens, int64_t(params.index_heads) * cache.index_dim, "index Q");
    M3_CHECK(selection.dtype() == DType::kI32 &&
                 selection.numel() == int64_t(view_.num_tokens) * params.index_heads * params.topk_blocks,
             "selection must be I32 [{}, {}, {}]", view_.num_tokens, params.index_heads,
             params.topk_blocks);
    cpu_indexer_topk(view_, cache, index_q.data_as<const float>(), params,
                     selection.data_as<int32_t>());
  }

  void indexer_topk_candidates(const KvLayerView& cache, const Tensor& index_q_parts, int parts,
                               const IndexerParams& params, int cp_size, int cp_rank,
                               Tensor candidates) override {
    check_indexer_candidates_args(view_.num_tokens, cache, index_q_parts, parts, params, cp_size,
                                  cp_rank, candidates);
    check_rows(index_q_parts, index_q_parts.dim(0), index_q_parts.dim(1), "gathered index Q");
    cpu_indexer_topk_candidates(view_, cache, index_q_parts.data_as<const float>(), parts, params,
                                cp_size, cp_rank, candidates.data_as<int64_t>());
  }

  void merge_topk_candidates(const Tensor& gathered, int cp_size, int parts, int part,
                             const IndexerParams& params, Tensor selection) override {
    check_merge_candidates_args(view_.num_tokens, gathered, cp_size, parts, part, params, selection);
    cpu_merge_topk_candidates(view_, gathered.data_as<const int64_t>(), cp_size, parts, part, params,
                              selection.data_as<int32_t>());
  }

  void paged_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads,
                       const Tensor& selection, int topk, float sm_scale, Tensor out) override {
    const int64_t cols = int64_t(num_q_heads) * cache.head_dim;
    check_rows(q, view_.num_tokens, cols, "Q");
    check_rows(out, view_.num_tokens, cols, "attention output");
    cpu_paged_attention(view_, cache, q.data_as<const float>(), num_q_heads,
                        selection.defined() ? selection.data_as<const int32_t>() : nullptr, topk,
                        sm_scale, out.data_as<float>(), nullptr);
    if (bf16_) {
      float* o = out.data_as<float>();
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = bf16_round(o[i]);
    }
  }

  void draft_block_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& block_k,
                             const Tensor& block_v, int block_len, int window, float sm_scale, Tensor out) override {
    check_draft_block_args(view_, cache, num_q_heads, block_len, window);
    const int64_t cols = int64_t(num_q_heads) * cache.head_dim, kv_cols = int64_t(cache.num_kv_heads) * cache.head_dim;
    check_rows(q, view_.num_tokens, cols, "draft Q");
    check_rows(block_k, view_.num_tokens, kv_cols, "draft block K");
    check_rows(block_v, view_.num_tokens, kv_cols, "draft block V");
    check_rows(out, view_.num_tokens, cols, "draft attention output");
    cpu_draft_block_attention(view_, cache, q.data_as<const float>(), num_q_heads, block_k.data_as<const float>(),
                              block_v.data_as<const float>(), block_len, window, sm_scale, out.data_as<float>());
    if (bf16_) {
      float* o = out.data_as<float>();
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = bf16_round(o[i]);
    }
  }

  void markov_drafts(const Tensor& base_logits, const Tensor& normed, const MarkovHeadWeights& head, int block_len,
                     int32_t* ids, float* confidence) override {
    const std::vector<int32_t>& rows = batch_->logits_rows;
    const MarkovHeadView view =
        check_markov_drafts_args(view_, static_cast<int>(rows.size()), base_logits, normed, head, block_len);
    const int blocks = view_.num_seqs, queries = view_.num_tokens / view_.num_seqs;
    for (int s = 0; s < blocks; ++s)
      for (int j = 0; j < block_len; ++j)
        M3_CHECK(rows[size_t(s) * block_len + j] == s * queries + j,
                 "markov_drafts: logits row {} of block {} is query {}, not its block's query {}", j, s,
                 rows[size_t(s) * block_len + j], s * queries + j);
#pragma omp parallel if (blocks > 1)
    {
      std::vector<float> scratch(view.vocab);
#pragma omp for schedule(dynamic, 1)
      for (int s = 0; s < blocks; ++s) {
        const int64_t row = int64_t(s) * block_len;
        markov_block(view, base_logits.data_as<const float>() + row * view.vocab,
                     normed.data_as<const float>() + row * view.hidden, block_len, batch_->token_ids[rows[row]],
                     [&](int, const float* logits) { return draft_argmax(logits, view.vocab); },
                     ids + row, confidence + row, scratch.data());
      }
    }
  }

  void swiglu_mlp(const Tensor& x, const LinearWeight& gate, const LinearWeight& up,
                  const LinearWeight& down, float alpha, float limit, Tensor out) override {
    check_rows(x, x.dim(0), gate.in_features, "MLP input");
    check_rows(out, x.dim(0), down.out_features, "MLP output");
    cpu::swiglu_mlp(x.data_as<const float>(), x.dim(0), gate, up, down, alpha, limit,
                    out.data_as<float>(), bf16_, scratch_);
  }

  void moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) override;

  void add_inplace(Tensor x, const Tensor& y) override {
    M3_CHECK(x.numel() == y.numel(), "add: {} vs {} elements", x.numel(), y.numel());
    float* a = x.data_as<float>();
    const float* b = y.data_as<const float>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; ++i) a[i] = round_act(a[i] + b[i], bf16_);
  }

  // The reference on the logits in place (they are host fp32 already); the logprob rows side by
  // side on the OpenMP threads (a 200K-token row is a pass of exp, ~1 ms on one core).
  void sample(const Tensor& logits, const SampleBatch& batch, int32_t* ids, RowLogprobs* logprobs) override {
    if (batch.rows.empty() && batch.logprobs.empty()) return;
    check_rows(logits, logits.dim(0), logits.dim(1), "logits");
    const auto vocab = static_cast<int32_t>(logits.dim(1));
    const float* x = logits.data_as<const float>();
    sample_batch_reference(x, logits.dim(0), vocab, batch, ids, sample_ws_);
    check_logprob_rows(batch, logits.dim(0), vocab, logprobs);
    const auto n = static_cast<int64_t>(batch.logprobs.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1 && n * vocab >= (int64_t{1} << 19))
    for (int64_t j = 0; j < n; ++j) logprob_row_reference(x, vocab, batch.logprobs[j], ids, logprobs[j]);
  }

  // The host tier is plain host memory; a copy is a memcpy per block, done before the call returns
  // (so nothing overlaps, and there is no batch to wait for).
  Tensor alloc_kv_host_tier(int64_t bytes, std::string_view what) override {
    M3_CHECK(bytes > 0, "cpu backend: {} of {} bytes", what, bytes);
    return Tensor::zeros({bytes}, DType::kU8);
  }
  void copy_kv_blocks(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies) override {
    check_kv_block_copies(pool, host, block_bytes, copies);
    uint8_t* p = pool.data_as<uint8_t>();
    uint8_t* h = host.data_as<uint8_t>();
    const auto timed = [](double& total, auto&& body) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const auto save = [&](const std::vector<KvBlockCopy>& list) {
      for (const KvBlockCopy& c : list) std::memcpy(h + c.host_slot * block_bytes, p + c.block * block_bytes, block_bytes);
    };
    timed(copy_times_.to_host_s, [&] { save(copies.to_host); });
    timed(copy_times_.to_device_s, [&] {
      for (const KvBlockCopy& c : copies.to_device) std::memcpy(p + c.block * block_bytes, h + c.host_slot * block_bytes, block_bytes);
    });
    timed(copy_times_.to_host_s, [&] { save(copies.to_host_ahead); });
  }
  KvCopyTimes kv_copy_times() const override { return copy_times_; }
  double measure_copy_rate(int64_t bytes, int repeats) override { return measure_host_copy_rate(bytes, repeats); }

 private:
  BackendConfig config_;
  KvCopyTimes copy_times_;
  bool bf16_ = false;
  const StepBatch* batch_ = nullptr;
  StepView view_;
  std::vector<float> cos_, sin_;  // [T, rotary_dim]
  cpu::Scratch scratch_;
  std::vector<cpu::Scratch> expert_scratch_;  // one per thread: MoE experts run side by side
  std::vector<int32_t> expert_rows_;  // MoE routing bookkeeping, reused across steps
  std::vector<float> expert_weights_;
  SampleWorkspace sample_ws_;
};

// The MoE block in the reference's order: shared expert, sigmoid router, experts in ascending id
// each adding weight * expert(x) into the routed sum, routed * scale + shared (routed * scale
// alone when !add_shared: the same roundings, so adding the shared expert afterwards is bitwise).
void CpuBackend::moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) {
  const int64_t rows = x.dim(0), hidden = x.dim(1);
  const int e_count = params.num_experts, k = params.experts_per_token;
  check_rows(out, rows, hidden, "MoE output");
  M3_CHECK(mlp.router.dtype() == DType::kF32 && mlp.router.numel() == int64_t(e_count) * hidden,
           "router weight must be F32 [{}, {}]", e_count, hidden);
  const int first = params.first_expert, held = static_cast<int>(mlp.experts.size());
  M3_CHECK(first >= 0 && held >= 1 && first + held <= e_count,
           "MoE layer holds experts [{}, {}) of the config's {}", first, first + held, e_count);
  const float* xs = x.data_as<const float>();
  // Scratch slots: 0-1 swiglu_mlp, 2 shared output, 3 router probs, 4 routed sum, 5 gathered
  // rows, 7 experts' outputs.
  float* shared = nullptr;
  if (params.add_shared) {
    shared = scratch_.shared(2, rows * hidden).data();
    cpu::swiglu_mlp(xs, rows, mlp.gate, mlp.up, mlp.down, params.swiglu_alpha, params.swiglu_limit,
                    shared, bf16_, scratch_);
  }

  float* probs = scratch_.shared(3, rows * e_count).data();
  cpu::gemm_xwt(xs, rows, hidden, mlp.router.data_as<const float>(), e_count, hidden, hidden, probs,
                e_count);
  const float* bias = mlp.router_bias.defined() ? mlp.router_bias.data_as<const float>() : nullptr;
  // chosen[r * k + i]: expert id; weight[r * k + i]: normalised p.
  expert_rows_.assign(rows * k, 0);
  expert_weights_.assign(rows * k, 0.0f);
  std::vector<int> order(e_count);
  std::vector<float> choice(e_count);
  for (int64_t r = 0; r < rows; ++r) {
    float* p = probs + r * e_count;
    for (int e = 0; e < e_count; ++e) {
      p[e] = 1.0f / (1.0f + std::exp(-p[e]));
      choice[e] = p[e] + (bias ? bias[e] : 0.0f);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    });
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += p[order[i]];
    for (int i = 0; i < k; ++i) {
      expert_rows_[r * k + i] = order[i];
      expert_weights_[r * k + i] = p[order[i]] / sum;
    }
  }

  // Each held expert's rows (ascending token) and routing weights.
  struct ExpertRows {
    int expert;
    std::vector<int64_t> tokens;
    std::vector<float> weights;
    int64_t offset = 0;  // of its output rows in `expert_out`
  };
  std::vector<ExpertRows> active;
  int64_t assigned = 0;
  for (int e = first; e < first + held; ++e) {
    ExpertRows er{e, {}, {}};
    for (int64_t r = 0; r < rows; ++r)
      for (int i = 0; i < k; ++i)
        if (expert_rows_[r * k + i] == e) {
          er.tokens.push_back(r);
          er.weights.push_back(expert_weights_[r * k + i]);
        }
    if (er.tokens.empty()) continue;
    er.offset = assigned;
    assigned += static_cast<int64_t>(er.tokens.size());
    active.push_back(std::move(er));
  }
  // Every expert's output, computed by the same code whichever thread runs it (linear's tiles do
  // not depend on the thread). With a few rows an expert (decode), experts run side by side, each
  // on one thread with its own scratch: a projection of a few rows is too small to share out, and
  // a parallel region per projection (three an expert) cost more than the products. With many
  // rows (prefill) the experts run one after another, each projection's tiles over the threads.
  float* expert_out = scratch_.shared(7, assigned * hidden).data();
  const auto run_expert = [&](const ExpertRows& er, cpu::Scratch& scratch) {
    const int64_t n = static_cast<int64_t>(er.tokens.size());
    float* gathered = scratch.shared(5, n * hidden).data();
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(gathered + i * hidden, xs + er.tokens[i] * hidden, sizeof(float) * hidden);
    const ExpertWeights& ew = mlp.experts[er.expert - first];
    cpu::swiglu_mlp(gathered, n, ew.gate, ew.up, ew.down, params.swiglu_alpha, params.swiglu_limit,
                    expert_out + er.offset * hidden, bf16_, scratch);
  };
  const int threads = omp_get_max_threads();
  const int n_active = static_cast<int>(active.size());
  if (threads > 1 && n_active > 1 && assigned < 16 * int64_t(n_active)) {
    if (static_cast<int>(expert_scratch_.size()) < threads) expert_scratch_.resize(threads);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n_active; ++i) run_expert(active[i], expert_scratch_[omp_get_thread_num()]);
  } else {
    for (const ExpertRows& er : active) run_expert(er, scratch_);
  }
  // The routed sum in ascending expert id, as the reference adds it.
  float* routed = scratch_.shared(4, rows * hidden).data();
  std::fill(routed, routed + rows * hidden, 0.0f);
  for (const ExpertRows& er : active) {
    for (size_t i = 0; i < er.tokens.size(); ++i) {
      float* dst = routed + er.tokens[i] * hidden;
      const float* src = expert_out + (er.offset + int64_t(i)) * hidden;
      for (int64_t c = 0; c < hidden; ++c)
        dst[c] = round_act(dst[c] + round_act(src[c] * er.weights[i], bf16_), bf16_);
    }
  }
  float* o = out.data_as<float>();
  const float scale = params.routed_scaling_factor;
  if (shared) {
    for (int64_t i = 0; i < rows * hidden; ++i)
      o[i] = round_act(round_act(routed[i] * scale, bf16_) + shared[i], bf16_);
  } else {
    for (int64_t i = 0; i < rows * hidden; ++i) o[i] = round_act(routed[i] * scale, bf16_);
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace m3
