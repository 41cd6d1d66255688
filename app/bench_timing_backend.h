// TimingBackend: a Backend that forwards every call to another one and, while timing is on,
// waits for each op to finish and adds its wall time, its calls and the bytes and FLOPs it must
// move and do (app/op_floors.h) to per-op totals (bench latency's per-op breakdown and per-op floors). The wait
// is a copy_to_host_f32 of one activation element, which synchronises the CUDA stream, so on a
// GPU every timed op also pays one launch + sync round trip (~10 us; sync_seconds() measures it):
// the breakdown runs in its own pass, never in the pass whose step time is reported.
// Linears are keyed by the last component of the weight name (q_proj, lm_head, ...).
#pragma once
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "app/op_floors.h"
#include "ops/backend.h"

namespace m3::app {

class TimingBackend final : public Backend {
 public:
  explicit TimingBackend(Backend& inner) : inner_(inner) {}

  // Timing on: every op waits for completion. The sync tensor is allocated, and the round trip
  // timed (the median of 15), on first use.
  void set_timing(bool on) {
    if (on && !sync_.defined()) {
      sync_ = inner_.alloc({1, 1}, inner_.activation_storage_dtype());
      std::vector<double> trips;
      for (int i = 0; i < 15; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        float sink = 0.0f;
        inner_.copy_to_host_f32(sync_, &sink);
        trips.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::nth_element(trips.begin(), trips.begin() + 7, trips.end());
      sync_seconds_ = trips[7];
    }
    timing_ = on;
  }
  void clear() {
    op_seconds_.clear();
    op_calls_.clear();
    op_bytes_.clear();
    op_flops_.clear();
  }
  const std::map<std::string, double>& op_seconds() const { return op_seconds_; }
  const std::map<std::string, double>& op_calls() const { return op_calls_; }
  const std::map<std::string, double>& op_bytes() const { return op_bytes_; }
  const std::map<std::string, double>& op_flops() const { return op_flops_; }
  // One wait's round trip with nothing to wait for, included once in every timed call.
  double sync_seconds() const { return sync_seconds_; }
  // An op's timed seconds less its calls' waits (0 at least).
  double busy_seconds(const std::string& op) const {
    return std::max(0.0, op_seconds_.at(op) - op_calls_.at(op) * sync_seconds_);
  }

  std::string_view name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  void configure(const BackendConfig& config) override { inner_.configure(config); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  DType activation_storage_dtype() const override { return inner_.activation_storage_dtype(); }
  Tensor alloc(Shape shape, DType dtype) override { return inner_.alloc(std::move(shape), dtype); }
  Tensor to_device(const Tensor& host, std::string_view what) override { return inner_.to_device(host, what); }
  void copy_to_host_f32(const Tensor& src, float* dst) override {
    timed("copy_logits_to_host", [&] { inner_.copy_to_host_f32(src, dst); }, [&] { return 2 * tensor_bytes(src); });
  }
  void sample(const Tensor& logits, const SampleBatch& rows, int32_t* ids, RowLogprobs* logprobs) override {
    timed("sample", [&] { inner_.sample(logits, rows, ids, logprobs); }, [&] { return tensor_bytes(logits); });
  }
  // The step's sequence lengths are kept for the KV bytes of the attention ops.
  void plan(const StepBatch& batch) override {
    seq_lens_ = batch.seq_lens;
    positions_ = batch.positions;
    timed("plan", [&] { inner_.plan(batch); }, [] { return 0.0; });
  }
  StepView planned_step() const override { return inner_.planned_step(); }
  Tensor alloc_kv_host_tier(int64_t bytes, std::string_view what) override {
    return inner_.alloc_kv_host_tier(bytes, what);
  }
  void copy_kv_blocks(const Tensor& pool, const Tensor& host, int64_t block_bytes, const KvBlockCopies& copies) override {
    timed("copy_kv_blocks", [&] { inner_.copy_kv_blocks(pool, host, block_bytes, copies); }, [] { return 0.0; });
  }
  KvCopyTimes kv_copy_times() const override { return inner_.kv_copy_times(); }
  double measure_copy_rate(int64_t bytes, int repeats) override { return inner_.measure_copy_rate(bytes, repeats); }
  // Timed steps run their ops one by one (each is waited for); untimed ones may replay graphs.
  void run_replayable(const ReplayKey& key, const std::function<void()>& body) override {
    if (timing_) body();
    else inner_.run_replayable(key, body);
  }
  void embed(const Tensor& table, int64_t first_id, Tensor out) override {
    timed("embed", [&] { inner_.embed(table, first_id, out); }, [&] { return 2 * tensor_bytes(out); });
  }
  void concat_column_parts(const Tensor& parts, int num_parts, Tensor out) override {
    timed("concat_column_parts", [&] { inner_.concat_column_parts(parts, num_parts, out); },
          [&] { return tensor_bytes(parts) + tensor_bytes(out); });
  }
  void gather_logits_rows(const Tensor& x, Tensor out) override {
    timed("gather_logits_rows", [&] { inner_.gather_logits_rows(x, out); }, [&] { return 2 * tensor_bytes(out); });
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    timed("rms_norm", [&] { inner_.rms_norm(x, weight, eps, out); },
          [&] { return tensor_bytes(x) + tensor_bytes(weight) + tensor_bytes(out); });
  }
  void linear(const Tensor& x, const LinearWeight& weight, Tensor out) override {
    timed("linear " + last_part(weight.name), [&] { inner_.linear(x, weight, out); },
          [&] { return OpWork{tensor_bytes(x) + weight_bytes(weight) + tensor_bytes(out), linear_flops(x, weight)}; });
  }
  // Named after the first weight ("linears q_proj": the attention projections in one op).
  void linears(const Tensor& x, std::span<const LinearOutput> outputs) override {
    const std::string name = outputs.empty() ? std::string() : last_part(outputs[0].weight->name);
    timed("linears " + name, [&] { inner_.linears(x, outputs); }, [&] {
      OpWork w{tensor_bytes(x), 0.0};
      for (const LinearOutput& o : outputs) {
        w.bytes += weight_bytes(*o.weight) + tensor_bytes(o.out);
        w.flops += linear_flops(x, *o.weight);
      }
      return w;
    });
  }
  void head_norm_rope(Tensor x, int num_heads, int head_dim, const Tensor& norm, float eps,
                      int rope_dims) override {
    timed("head_norm_rope", [&] { inner_.head_norm_rope(x, num_heads, head_dim, norm, eps, rope_dims); },
          [&] { return 2 * tensor_bytes(x) + tensor_bytes(norm); });
  }
  void kv_insert(const KvLayerView& cache, const Tensor& k, const Tensor& v, const Tensor& index_k) override {
    timed("kv_insert", [&] { inner_.kv_insert(cache, k, v, index_k); }, [&] {
      return tensor_bytes(k) + tensor_bytes(v) + tensor_bytes(index_k) + kv_write_bytes(cache, k.defined() ? k.dim(0) : 0);
    });
  }
  void attention_input(const KvLayerView& cache, const AttentionInputs& in) override {
    timed("attention_input", [&] { inner_.attention_input(cache, in); }, [&] {
      // q, k, index_k and index_q normed in place (read and written), v read, the new rows written.
      return 2 * (tensor_bytes(in.q) + tensor_bytes(in.k) + tensor_bytes(in.index_k) + tensor_bytes(in.index_q)) +
             tensor_bytes(in.v) + tensor_bytes(in.q_norm) + tensor_bytes(in.k_norm) + tensor_bytes(in.index_k_norm) +
             tensor_bytes(in.index_q_norm) + kv_write_bytes(cache, in.q.defined() ? in.q.dim(0) : 0);
    });
  }
  void indexer_topk(const KvLayerView& cache, const Tensor& index_q, const IndexerParams& params,
                    Tensor selection) override {
    timed("indexer_topk", [&] { inner_.indexer_topk(cache, index_q, params, selection); }, [&] {
      return OpWork{tensor_bytes(index_q) + tensor_bytes(selection) + index_read_bytes(cache, seq_lens_),
                    indexer_flops(cache, index_q, positions_)};
    });
  }
  void indexer_topk_candidates(const KvLayerView& cache, const Tensor& index_q_parts, int parts,
                               const IndexerParams& params, int cp_size, int cp_rank, Tensor candidates) override {
    timed(
        "indexer_topk_candidates",
        [&] { inner_.indexer_topk_candidates(cache, index_q_parts, parts, params, cp_size, cp_rank, candidates); },
        [&] {
          // This rank's share of the blocks (context parallel over cp_size ranks).
          const int ranks = std::max(1, cp_size);
          return OpWork{tensor_bytes(index_q_parts) + tensor_bytes(candidates) + index_read_bytes(cache, seq_lens_) / ranks,
                        indexer_flops(cache, index_q_parts, positions_) / ranks};
        });
  }
  void merge_topk_candidates(const Tensor& gathered, int cp_size, int parts, int part, const IndexerParams& params,
                             Tensor selection) override {
    timed("merge_topk_candidates",
          [&] { inner_.merge_topk_candidates(gathered, cp_size, parts, part, params, selection); },
          [&] { return tensor_bytes(gathered) + tensor_bytes(selection); });
  }
  void paged_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& selection,
                       int topk, float sm_scale, Tensor out) override {
    timed("paged_attention", [&] { inner_.paged_attention(cache, q, num_q_heads, selection, topk, sm_scale, out); },
          [&] {
            return OpWork{tensor_bytes(q) + tensor_bytes(selection) + tensor_bytes(out) +
                              attention_read_bytes(cache, seq_lens_, topk),
                          attention_flops(cache, q, num_q_heads, positions_, topk)};
          });
  }
  void draft_block_attention(const KvLayerView& cache, const Tensor& q, int num_q_heads, const Tensor& block_k,
                             const Tensor& block_v, int block_len, int window, float sm_scale, Tensor out) override {
    timed("draft_block_attention",
          [&] { inner_.draft_block_attention(cache, q, num_q_heads, block_k, block_v, block_len, window, sm_scale, out); },
          [&] { return tensor_bytes(q) + tensor_bytes(block_k) + tensor_bytes(block_v) + tensor_bytes(out); });
  }
  void markov_drafts(const Tensor& base_logits, const Tensor& normed, const MarkovHeadWeights& head, int block_len,
                     int32_t* ids, float* confidence) override {
    timed("markov_drafts", [&] { inner_.markov_drafts(base_logits, normed, head, block_len, ids, confidence); },
          [&] {
            return tensor_bytes(base_logits) + tensor_bytes(normed) + tensor_bytes(head.w1) + tensor_bytes(head.w2) +
                   tensor_bytes(head.confidence_w);
          });
  }
  void swiglu_mlp(const Tensor& x, const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down,
                  float alpha, float limit, Tensor out) override {
    timed("swiglu_mlp", [&] { inner_.swiglu_mlp(x, gate, up, down, alpha, limit, out); }, [&] {
      return OpWork{tensor_bytes(x) + weight_bytes(gate) + weight_bytes(up) + weight_bytes(down) + tensor_bytes(out),
                    linear_flops(x, gate) + linear_flops(x, up) + linear_flops(x, down)};
    });
  }
  void moe(const Tensor& x, const MlpWeights& mlp, const MoeParams& params, Tensor out) override {
    timed("moe", [&] { inner_.moe(x, mlp, params, out); }, [&] { return OpWork{moe_bytes(x, mlp, params, out), moe_flops(x, mlp, params)}; });
  }
  void add_inplace(Tensor x, const Tensor& y) override {
    timed("add_inplace", [&] { inner_.add_inplace(x, y); }, [&] { return 2 * tensor_bytes(x) + tensor_bytes(y); });
  }
  void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) override {
    timed("add_rms_norm", [&] { inner_.add_rms_norm(x, y, weight, eps, out); },
          [&] { return 2 * tensor_bytes(x) + tensor_bytes(y) + tensor_bytes(weight) + tensor_bytes(out); });
  }

 private:
  // "model.layers.3.self_attn.q_proj" -> "q_proj": one key per kind of weight over the layers.
  static std::string last_part(const std::string& name) {
    const std::size_t dot = name.rfind('.');
    return dot == std::string::npos ? name : name.substr(dot + 1);
  }
  // work_of(): the op's OpWork (a bare byte count converts: its FLOPs are 0).
  template <class Op, class Work>
  void timed(const std::string& key, Op&& op, Work&& work_of) {
    if (!timing_) {
      op();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    op();
    float sink = 0.0f;
    inner_.copy_to_host_f32(sync_, &sink);
    op_seconds_[key] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const OpWork w = as_work(work_of());
    op_calls_[key] += 1;
    op_bytes_[key] += w.bytes;
    op_flops_[key] += w.flops;
  }

  Backend& inner_;
  bool timing_ = false;
  Tensor sync_;
  double sync_seconds_ = 0;
  static OpWork as_work(double bytes) { return OpWork{bytes, 0.0}; }
  static OpWork as_work(const OpWork& w) { return w; }

  std::vector<int32_t> seq_lens_, positions_;  // the planned step's
  std::map<std::string, double> op_seconds_, op_calls_, op_bytes_, op_flops_;
};

}  // namespace m3::app
