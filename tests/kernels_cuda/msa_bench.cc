// Benchmark of the MSA CUDA kernels against their byte / FLOP floors (prints a table).
//
//   msa_bench [--suite decode|lowlat|dense|targets|probe|prefill|all] [--dtype nvfp4|fp8|all] [--quick]
//             [--case Q,B,TOKENS] [--prefill-case ID]
//   msa_bench --fp8-mma-probe
//   (--quick: a subset of every suite; --case: the one targets case, e.g. for a profiler;
//   --prefill-case: the prefill suite's cases whose id contains ID, e.g. one shape for a profiler;
//   --fp8-mma-probe: how exactly the FP8 tensor-core MMAs accumulate, mma.sync and wgmma (E4M3 and the
//   same values as fp16), against exact sums)
//
// The "targets" suite is the M3.1 layer on one GPU (Hq 64 / Hkv 4 / Hi 4, one shared index-K),
// Q = 1 and Q = 8 per request, 4K to 256K tokens, batch 1 to 64; it prints what issue 19 item 2
// asks of each op: the indexer against copy bandwidth, sparse attention against its byte floor,
// and the whole MSA layer against the byte floor of dense attention over the same cache.
//
// Shapes: the vendor's suites (docs/reference.md 7) at the TP4 per-rank shape the vendor
// benchmarks (Hq 16, Hkv 1, Hi 1, D 128, page 128, top-16, 8 queries per request). Decode lengths
// follow the vendor's recipe (B/2 deltas in [nominal/20, nominal/4], nominal +- delta, shuffled,
// exact mean) with this program's own seeded generator (torch's generator is not reproduced).
// Timing: each op captured N times in a CUDA graph, every call on a different layer of the cache so
// the N layers span >= 2.5x the L2 (cold L2), 3 warm-up replays, median of 10 replays / N.
// Floors: bytes each op must move (every input byte read once, every output written once; counted
// below per op) over the measured device-to-device copy bandwidth; prefill also FLOP/s.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "formats/fp8_e4m3.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/msa.h"
#include "kernels/cuda/msa_kernels.h"
#include "kernels/cuda/msa_schedule.h"
#include "tests/kernels_cuda/msa_bench_fill.h"
#include "tests/kernels_cuda/msa_testing.h"

namespace m3::cuda::testing {
namespace {

constexpr int kBlock = 128, kDim = 128, kTopk = 16;

struct Device {
  int sms = 0;
  size_t l2_bytes = 0;
  double copy_bps = 0;  // measured device-to-device copy, bytes read + written per second
};

Device probe_device() {
  Device d;
  int dev = 0;
  MSA_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp p;
  MSA_CUDA(cudaGetDeviceProperties(&p, dev));
  d.sms = p.multiProcessorCount;
  d.l2_bytes = p.l2CacheSize;
  // The floor's rate every bench and bench latency use: the CUDA backend's timed copy.
  d.copy_bps = make_cuda_backend()->measure_copy_rate(int64_t{1} << 30, 6);
  std::printf("device: %s, %d SMs, L2 %.0f MB, measured copy %.2f TB/s (read + write)\n", p.name, d.sms,
              d.l2_bytes / 1e6, d.copy_bps / 1e12);
  return d;
}

// Median time of one call: `calls` calls (one per layer) captured in a graph.
double time_graph(cudaStream_t s, int calls, const std::function<void(int)>& fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < calls; ++l) fn(l);
  MSA_CUDA(cudaStreamEndCapture(s, &graph));
  MSA_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  MSA_CUDA(cudaEventCreate(&e0));
  MSA_CUDA(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    MSA_CUDA(cudaEventRecord(e0, s));
    MSA_CUDA(cudaGraphLaunch(exec, s));
    MSA_CUDA(cudaEventRecord(e1, s));
    MSA_CUDA(cudaEventSynchronize(e1));
    float t;
    MSA_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  MSA_CUDA(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms[ms.size() / 2] * 1e3 / calls;  // microseconds per call
}

struct Row {
  std::string suite, dtype;
  int batch = 0, q = 0;
  int64_t nominal = 0;
  double mean_len = 0;
  double idx_us = 0, topk_us = 0, it_us = 0, sparse_us = 0, dense_us = 0;
  double idx_bytes = 0, sparse_bytes = 0, dense_bytes = 0, idx_flops = 0, sparse_flops = 0;
  double idx_probe_us = 0, sparse_probe_us = 0;  // "probe" suite: nvfp4 decode / expansion left out
  double group_mma_flops = 0;  // the NVFP4 row-group walk's MMAs, masked query columns included
  int splits = 0;
};

struct Case {
  std::string suite;
  int64_t nominal = 0;
  std::vector<SeqSpec> seqs;
  bool dense = true;
  int hq = 16, hkv = 1;  // per-rank heads; index heads = hkv
};

// The vendor's decode length recipe (structure only; see the file comment).
std::vector<int> decode_lengths(int batch, int64_t nominal) {
  std::mt19937_64 rng(1701 + uint64_t(batch) * 1009 + nominal);
  std::uniform_int_distribution<int64_t> delta(nominal / 20, nominal / 4);
  std::vector<int> lens;
  for (int i = 0; i < batch / 2; ++i) {
    const int64_t d = delta(rng);
    lens.push_back(int(nominal - d));
    lens.push_back(int(nominal + d));
  }
  if (batch % 2) lens.push_back(int(nominal));
  std::shuffle(lens.begin(), lens.end(), rng);
  return lens;
}

Row run_case(const Device& dev, const Case& c, KvDType kv_dtype, cudaStream_t s) {
  std::mt19937_64 rng(42);
  const int hq = c.hq, hkv = c.hkv;
  BuiltStep built = build_step(c.seqs, kBlock, PageLayout::kPermuted, 0, rng);
  const StepBatch& b = built.batch;
  const int T = b.num_tokens();
  const KvDType idx_dtype = kv_dtype;
  KvLayout one = KvLayout::make(kBlock, hkv, kDim, kDim, kv_dtype, idx_dtype, {true});
  const double layer_bytes = double(built.num_blocks) * one.block_bytes;
  const int layers = std::clamp(int(std::ceil(2.5 * dev.l2_bytes / layer_bytes)), 1, 256);
  const KvLayout layout = KvLayout::make(kBlock, hkv, kDim, kDim, kv_dtype, idx_dtype, std::vector<bool>(layers, true));
  DeviceMem pool(size_t(built.num_blocks) * layout.block_bytes);
  MSA_CUDA(fill_random_bytes(pool.as(), pool.bytes(), 1234, kv_dtype == KvDType::kFP8, s));
  std::vector<KvLayerView> views;
  for (int l = 0; l < layers; ++l) views.push_back(layout.layer_view(pool.as<uint8_t>(), l));
  if (kv_dtype == KvDType::kNVFP4) {
    std::vector<int64_t> regions;
    const KvLayerView& v0 = views[0];
    for (int l = 0; l < layers; ++l) {
      const int64_t base = layout.layer_offset[l];
      for (int which = 0; which < 2; ++which)
        regions.push_back(base + (v0.kv_row_scales(0, which, 0, 0) - v0.pool - v0.layer_offset));
      regions.push_back(base + (v0.index_row_scales(0, 0) - v0.pool - v0.layer_offset));
    }
    DeviceMem d_regions = upload(regions);
    MSA_CUDA(fix_nvfp4_scales(pool.as<uint8_t>(), built.num_blocks, layout.block_bytes, d_regions.as<int64_t>(),
                              int(regions.size()), kBlock * kDim / 16, 99, s));
    MSA_CUDA(cudaStreamSynchronize(s));
  }
  DeviceMem q(size_t(T) * hq * kDim * 2), iq(size_t(T) * hkv * kDim * 2);
  MSA_CUDA(fill_random_bf16(q.as<uint16_t>(), size_t(T) * hq * kDim, 7, s));
  MSA_CUDA(fill_random_bf16(iq.as<uint16_t>(), size_t(T) * hkv * kDim, 8, s));
  DeviceMem sel(size_t(T) * hkv * kTopk * 4), out(size_t(T) * hq * kDim * 2), lse(size_t(T) * hq * 4);
  DeviceStep ds = upload_step(b);

  MsaConfig cfg;
  cfg.num_q_heads = hq;
  cfg.num_kv_heads = hkv;
  cfg.indexer = {hkv, kTopk, 1, 0};
  cfg.dense = c.dense;
  MsaPlan plan(cfg);
  plan.plan(b, ds.view, s);
  plan.indexer_topk(views[0], iq.as(), ActDType::kBF16, sel.as<int32_t>(), s);
  MSA_CUDA(cudaStreamSynchronize(s));
  const float sm_scale = 1.0f / std::sqrt(float(kDim));

  Row r;
  r.suite = c.suite;
  r.dtype = std::string(kv_dtype_name(kv_dtype));
  r.batch = b.num_seqs();
  r.q = c.seqs[0].q_len;
  r.nominal = c.nominal;
  r.splits = plan.stats().sparse_splits;
  double sum_len = 0;
  for (int x : b.seq_lens) sum_len += x;
  r.mean_len = sum_len / b.num_seqs();

  r.idx_us = time_graph(s, layers, [&](int l) { plan.indexer_scores(views[l], iq.as(), ActDType::kBF16, s); });
  r.topk_us = time_graph(s, layers, [&](int) { plan.topk(sel.as<int32_t>(), s); });
  r.it_us = time_graph(s, layers, [&](int l) {
    plan.indexer_topk(views[l], iq.as(), ActDType::kBF16, sel.as<int32_t>(), s);
  });
  r.sparse_us = time_graph(s, layers, [&](int l) {
    plan.attention(views[l], q.as(), ActDType::kBF16, sel.as<int32_t>(), sm_scale, out.as<uint16_t>(), lse.as<float>(), s);
  });
  if (c.suite == "probe" && kv_dtype == KvDType::kNVFP4) {
    plan.set_timing_probe({true, true});
    r.idx_probe_us =
        time_graph(s, layers, [&](int l) { plan.indexer_scores(views[l], iq.as(), ActDType::kBF16, s); });
    r.sparse_probe_us = time_graph(s, layers, [&](int l) {
      plan.attention(views[l], q.as(), ActDType::kBF16, sel.as<int32_t>(), sm_scale, out.as<uint16_t>(),
                     lse.as<float>(), s);
    });
    plan.set_timing_probe({});
  }
  if (c.dense)
    r.dense_us = time_graph(s, layers, [&](int l) {
      plan.attention(views[l], q.as(), ActDType::kBF16, nullptr, sm_scale, out.as<uint16_t>(), lse.as<float>(), s);
    });

  // Byte and FLOP floors.
  const double index_block = double(views[0].index_slot_bytes());
  const double kv_block = 2.0 * views[0].kv_slot_bytes();  // K + V of one KV head
  const double row_io = double(hq) * kDim * 2 * 2 + hq * 4;  // q read, out written, lse
  const std::vector<int32_t> h_sel = download<int32_t>(sel, size_t(T) * hkv * kTopk);
  for (int sq = 0; sq < b.num_seqs(); ++sq) {
    const int r0 = b.query_start[sq], r1 = b.query_start[sq + 1];
    const int last_local = b.positions[r1 - 1] / kBlock;
    // Indexer: the history blocks the rows need scored (all but the forced local block), read once.
    if (last_local + 1 > kTopk) r.idx_bytes += double(last_local) * index_block;
    for (int t = r0; t < r1; ++t) {
      const int local = b.positions[t] / kBlock;
      if (local + 1 > kTopk) r.idx_flops += 2.0 * kDim * kBlock * local * hkv;
    }
    r.idx_bytes += double(r1 - r0) * hkv * kDim * 2;
    // Sparse attention: per KV head, the union of the rows' selected blocks, K and V read once.
    for (int g = 0; g < hkv; ++g) {
      std::set<int> blocks;
      for (int t = r0; t < r1; ++t)
        for (int j = 0; j < kTopk; ++j) {
          const int blk = h_sel[(size_t(t) * hkv + g) * kTopk + j];
          if (blk < 0) continue;
          blocks.insert(blk);
          const int keys = std::min(kBlock, b.positions[t] - blk * kBlock + 1);
          r.sparse_flops += 4.0 * (hq / hkv) * kDim * keys;
        }
      r.sparse_bytes += double(blocks.size()) * kv_block;
    }
    r.sparse_bytes += (r1 - r0) * row_io;
    r.dense_bytes += double(last_local + 1) * kv_block * hkv + (r1 - r0) * row_io;
  }
  // The NVFP4 row-group walk's MMAs, on the groups build_msa_schedule makes of this step (one
  // entry per group and KV head: part 0 of its union's parts): each 64-key tile of the group's
  // union costs the wgmma tile's 64 query columns (4 rows x 16 heads, whether a row selected the
  // tile or not) x 64 keys x 128 dims, twice (S and PV). Against sparse_flops: how much of the
  // walk's tensor work is useful, which depends on how many blocks the group's rows share.
  const MsaSchedule sched = build_msa_schedule(cfg, b, MsaSlots{}, 0);
  const int tiles_per_block = kBlock / detail::kTileTokens;
  for (const detail::SparseWork& w : sched.sparse_groups) {
    if (w.begin != 0) continue;
    std::map<int, int> last;  // union block -> latest position of a row that selected it
    for (int t = w.row; t < w.row + w.row_count; ++t)
      for (int j = 0; j < kTopk; ++j) {
        const int blk = h_sel[(size_t(t) * hkv + w.kv_head) * kTopk + j];
        if (blk < 0 || blk * kBlock > b.positions[t]) continue;
        auto it = last.try_emplace(blk, b.positions[t]).first;
        it->second = std::max(it->second, b.positions[t]);
      }
    for (const auto& [blk, pos] : last)
      r.group_mma_flops += 4.0 * 64 * detail::kTileTokens * kDim *
                           std::min(tiles_per_block, (pos - blk * kBlock) / detail::kTileTokens + 1);
  }
  return r;
}

void print_header() {
  std::printf("%-8s %-6s %4s %7s %8s | %8s %6s %5s | %7s %5s | %8s %6s %5s %6s | %9s %6s %5s | %7s %7s\n", "suite",
              "dtype", "B", "nominal", "mean_len", "idx_us", "TB/s", "%cpy", "topk_us", "%idx", "sparse", "TB/s", "%cpy",
              "TF/s", "dense_us", "TB/s", "%cpy", "speedup", "vsfloor");
}

void print_row(const Device& dev, const Row& r) {
  auto tbs = [](double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e12 : 0.0; };
  const double idx_bw = tbs(r.idx_bytes, r.idx_us), sp_bw = tbs(r.sparse_bytes, r.sparse_us),
               de_bw = tbs(r.dense_bytes, r.dense_us);
  const double copy = dev.copy_bps / 1e12;
  const double msa_us = r.it_us + r.sparse_us;
  const double dense_floor_us = r.dense_bytes / dev.copy_bps * 1e6;
  std::printf("%-8s %-6s %4d %7lld %8.0f | %8.1f %6.2f %5.0f | %7.1f %5.0f | %8.1f %6.2f %5.0f %6.0f | %9.1f %6.2f %5.0f | %7.2f %7.2f\n",
              r.suite.c_str(), r.dtype.c_str(), r.batch, static_cast<long long>(r.nominal), r.mean_len, r.idx_us,
              idx_bw, 100 * idx_bw / copy, r.topk_us, r.idx_us > 0 ? 100 * r.topk_us / r.idx_us : 0.0, r.sparse_us,
              sp_bw, 100 * sp_bw / copy, r.sparse_flops / (r.sparse_us * 1e-6) / 1e12, r.dense_us, de_bw,
              100 * de_bw / copy, r.dense_us > 0 ? r.dense_us / msa_us : 0.0, dense_floor_us / msa_us);
}

// Issue 19 item 2, per case: indexer (with top-k) at >= 70% of copy from 32K tokens; sparse
// attention at >= 50% of its byte floor; indexer + top-k + sparse attention >= 5x faster than
// the byte floor of dense attention over the same cache at 128K.
void print_targets(const Device& dev, const std::vector<Row>& rows) {
  std::printf("\nIssue 19 item 2 (M3.1 on one GPU: Hq 64 / Hkv 4 / Hi 4, top-16; us per layer): idx+topk %%cpy = "
              "indexer byte floor / (indexer + top-k) of copy; sparse %%floor = its byte floor time / its time; "
              "x dense floor = dense byte floor time / (indexer + top-k + sparse)\n");
  std::printf("%-6s %2s %4s %7s | %8s %8s %7s | %8s %7s | %8s %9s %8s\n", "dtype", "Q", "B", "tokens", "idx+topk",
              "%cpy", ">=70%", "sparse", "%floor", "msa_us", "dense_fl", "x dense");
  for (const Row& r : rows) {
    const double idx_floor_us = r.idx_bytes / dev.copy_bps * 1e6, sp_floor_us = r.sparse_bytes / dev.copy_bps * 1e6;
    const double dense_floor_us = r.dense_bytes / dev.copy_bps * 1e6, msa_us = r.it_us + r.sparse_us;
    const double idx_pct = r.it_us > 0 ? 100 * idx_floor_us / r.it_us : 0.0;
    std::printf("%-6s %2d %4d %7lld | %8.1f %8.0f %7s | %8.1f %7.0f | %8.1f %9.1f %8.2f\n", r.dtype.c_str(), r.q,
                r.batch, static_cast<long long>(r.nominal), r.it_us, idx_pct,
                r.nominal < 32768 ? "-" : idx_pct >= 70 ? "met" : "no", r.sparse_us,
                r.sparse_us > 0 ? 100 * sp_floor_us / r.sparse_us : 0.0, msa_us, dense_floor_us,
                msa_us > 0 ? dense_floor_us / msa_us : 0.0);
  }
}

// Random finite E4M3 bytes (every code but the NaNs), for the MMA probes.
std::vector<uint8_t> random_finite_e4m3(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> out(n);
  for (auto& v : out)
    do v = uint8_t(rng()); while ((v & 0x7f) == 0x7f);
  return out;
}

// How far computed sums of 128 E4M3 products (row a . row b) are from the exact ones: relative to
// the sum of |products| (what an accumulator of fewer bits would lose) and to |exact| where the
// sum does not cancel.
struct SumError {
  double of_magnitude = 0, of_exact = 0;
  void add(float got, const uint8_t* a, const uint8_t* b) {
    double exact = 0, mag = 0;
    for (int k = 0; k < 128; ++k) {
      const double p = double(fp8_e4m3_decode(a[k])) * fp8_e4m3_decode(b[k]);
      exact += p;
      mag += std::fabs(p);
    }
    const double err = std::fabs(double(got) - exact);
    of_magnitude = std::max(of_magnitude, err / mag);
    if (std::fabs(exact) > 0.1 * mag) of_exact = std::max(of_exact, err / std::fabs(exact));
  }
};

// wgmma's sums over k = 128, by E4M3 MMAs and by fp16 MMAs on the widened values (what the sparse
// attention walks score with: wgmma.cuh), against exact sums.
void wgmma_sum_probe_report(cudaStream_t s) {
  constexpr int kTrials = 512;
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> a = random_finite_e4m3(rng, size_t(kTrials) * 64 * 128);
  const std::vector<uint8_t> b = random_finite_e4m3(rng, size_t(kTrials) * 16 * 128);
  const size_t n = size_t(kTrials) * 64 * 16;
  DeviceMem da = upload(a), db = upload(b), d8(n * 4), d16(n * 4);
  MSA_CUDA(wgmma_sum_probe(da.as<uint8_t>(), db.as<uint8_t>(), d8.as<float>(), d16.as<float>(), kTrials, s));
  MSA_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> o8 = download<float>(d8, n), o16 = download<float>(d16, n);
  SumError e4m3, f16;
  for (int tr = 0; tr < kTrials; ++tr)
    for (int row = 0; row < 64; ++row)
      for (int col = 0; col < 16; ++col) {
        const size_t e = (size_t(tr) * 64 + row) * 16 + col;
        const uint8_t* ar = &a[(size_t(tr) * 64 + row) * 128];
        const uint8_t* br = &b[(size_t(tr) * 16 + col) * 128];
        e4m3.add(o8[e], ar, br);
        f16.add(o16[e], ar, br);
      }
  std::printf("wgmma probe (m64n16, k = 128, %d trials): max |err| / sum|products|: e4m3 k32 x 4 %.3g, fp16 k16 x 8 "
              "%.3g; max |err| / |exact| where |exact| > 0.1 sum|products|: e4m3 %.3g, fp16 %.3g\n",
              kTrials, e4m3.of_magnitude, f16.of_magnitude, e4m3.of_exact, f16.of_exact);
}

// mma.sync m16n8k32 e4m3 against exact sums over k = 128, then wgmma's (above).
void fp8_mma_probe_report(cudaStream_t s) {
  constexpr int kTrials = 4096;
  std::mt19937_64 rng(5);
  const std::vector<uint8_t> a = random_finite_e4m3(rng, size_t(kTrials) * 16 * 128);
  const std::vector<uint8_t> b = random_finite_e4m3(rng, size_t(kTrials) * 8 * 128);
  DeviceMem da = upload(a), db = upload(b), dout(size_t(kTrials) * 128 * 4);
  MSA_CUDA(fp8_mma_probe(da.as<uint8_t>(), db.as<uint8_t>(), dout.as<float>(), kTrials, s));
  MSA_CUDA(cudaStreamSynchronize(s));
  const std::vector<float> out = download<float>(dout, size_t(kTrials) * 128);
  SumError err;
  for (int tr = 0; tr < kTrials; ++tr)
    for (int e = 0; e < 128; ++e) {
      const int lane = e / 4, c = e % 4, g = lane >> 2, t = lane & 3;
      const int row = g + 8 * (c >> 1), col = 2 * t + (c & 1);
      err.add(out[size_t(tr) * 128 + e], &a[(size_t(tr) * 16 + row) * 128], &b[(size_t(tr) * 8 + col) * 128]);
    }
  std::printf("fp8 mma probe (m16n8k32 e4m3, k = 128, %d trials): max |err| / sum|products| %.3g (fp32 "
              "accumulation ~6e-8), max |err| / |exact| where |exact| > 0.1 sum|products| %.3g\n",
              kTrials, err.of_magnitude, err.of_exact);
  wgmma_sum_probe_report(s);
}

// Prefill shapes: representative and stress cases of the vendor's 128-case selection (MiniMax-AI/MSA
// datas/inference, MIT; docs/reference.md 7).
struct PrefillShape {
  const char* case_id;
  std::vector<int> query_lens, prefix_lens;
};
const std::vector<PrefillShape>& prefill_shapes() {
  static const std::vector<PrefillShape> shapes = {
      {"prefill_4469427d069d9467c4ec", {171}, {55168}},
      {"prefill_f97f037f8487ee6aa442", {338}, {74240}},
      {"prefill_36d8d7ac7e52c5d67548", {1404}, {45440}},
      {"prefill_247ae467810aea26ebbf", {1626}, {91520}},
      {"prefill_c17ccf7fbbb5d1ee5648", {16384}, {31360}},
      {"prefill_167dfbd500b44961b5cb", {16384}, {68096}},
      {"prefill_eb345f6ede4eae3bb3cb", {247, 15942}, {84736, 48128}},
      {"prefill_ed173f6b3cdc11c49f0c", {16384}, {304896}},
  };
  return shapes;
}

}  // namespace
}  // namespace m3::cuda::testing

int main(int argc, char** argv) {
  using namespace m3::cuda::testing;
  using m3::KvDType;
  std::string suite = "all", dtype = "all", prefill_case;
  bool quick = false, fp8_probe = false;
  int one_q = 0, one_batch = 0;
  long long one_len = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%d,%d,%lld", &one_q, &one_batch, &one_len) != 3 || one_q < 1 || one_batch < 1 ||
          one_len < 1) {
        std::printf("msa_bench: --case takes Q,B,TOKENS (positive integers)\n");
        return 2;
      }
      suite = "targets";
    } else if (!std::strcmp(argv[i], "--prefill-case") && i + 1 < argc) {
      prefill_case = argv[++i];
      suite = "prefill";
    } else if (!std::strcmp(argv[i], "--fp8-mma-probe")) {
      fp8_probe = true;
    } else if (!std::strcmp(argv[i], "--suite") && i + 1 < argc) suite = argv[++i];
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  try {
    cudaStream_t s;
    MSA_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (fp8_probe) {
      fp8_mma_probe_report(s);
      return 0;
    }
    const Device dev = probe_device();
    std::vector<Case> cases;
    auto want = [&](const char* name) { return suite == "all" || suite == name; };
    if (want("decode")) {
      const std::vector<int> batches = quick ? std::vector<int>{8, 128} : std::vector<int>{8, 32, 64, 128};
      const std::vector<int64_t> noms = quick ? std::vector<int64_t>{1000, 100000, 200000}
                                              : std::vector<int64_t>{1000, 4000, 5000, 10000, 50000, 100000, 200000};
      for (int bsz : batches)
        for (int64_t nom : noms) {
          Case c{"decode", nom, {}, true};
          for (int len : decode_lengths(bsz, nom)) c.seqs.push_back({8, len});
          cases.push_back(c);
        }
    }
    if (want("lowlat"))
      for (int bsz : quick ? std::vector<int>{1} : std::vector<int>{1, 2, 4})
        for (int64_t kv : {1000, 4000, 8000, 32000}) {
          Case c{"lowlat", kv, {}, true};
          for (int len : bsz == 1 ? std::vector<int>{int(kv)} : decode_lengths(bsz, kv)) c.seqs.push_back({8, len});
          cases.push_back(c);
        }
    // MSA against dense attention over the same cache, at the TP4 per-rank shape and at the whole
    // model on one GPU (64 query / 4 KV / 4 index heads: dense reads 4 KV heads, MSA one index-K).
    if (want("dense"))
      for (int heads : {1, 4})
        for (int bsz : quick ? std::vector<int>{8} : std::vector<int>{8, 32})
          for (int64_t kv : {32768, 131072, 524288}) {
            Case c{heads == 1 ? "vsd-tp4" : "vsd-tp1", kv, {}, true, 16 * heads, heads};
            for (int i = 0; i < bsz; ++i) c.seqs.push_back({8, int(kv)});
            cases.push_back(c);
          }
    if (want("targets")) {
      std::vector<int> batches = quick ? std::vector<int>{1, 64} : std::vector<int>{1, 8, 64};
      std::vector<int64_t> lens = quick ? std::vector<int64_t>{4096, 131072}
                                        : std::vector<int64_t>{4096, 32768, 131072, 262144};
      std::vector<int> qs = {1, 8};
      if (one_q > 0) qs = {one_q}, batches = {one_batch}, lens = {one_len};
      for (int q : qs)
        for (int bsz : batches)
          for (int64_t len : lens) {
            Case c{"targets", len, {}, false, 64, 4};
            for (int l : decode_lengths(bsz, len)) c.seqs.push_back({q, l});
            cases.push_back(c);
          }
    }
    std::vector<KvDType> dtypes;
    if (dtype == "all" || dtype == "nvfp4") dtypes.push_back(KvDType::kNVFP4);
    if (dtype == "all" || dtype == "fp8") dtypes.push_back(KvDType::kFP8);

    std::printf("\nDecode (Q=8 per request, Hq 16 / Hkv 1 / Hi 1 unless vsd-tp1: 64 / 4 / 4; top-16): per-layer us; "
                "TB/s against the byte floor; %%cpy = of measured copy; speedup = dense kernel / (indexer+topk + "
                "sparse); vsfloor = dense byte floor time / (indexer+topk + sparse)\n");
    print_header();
    std::vector<Row> target_rows;
    for (KvDType dt : dtypes)
      for (const Case& c : cases) {
        const Row r = run_case(dev, c, dt, s);
        print_row(dev, r);
        if (c.suite == "targets") target_rows.push_back(r);
      }
    if (!target_rows.empty()) print_targets(dev, target_rows);

    if (want("probe")) {
      std::printf("\nProbes (nvfp4, timing only): the same kernels with the nvfp4 decode (indexer) or the K/V "
                  "expansion (sparse attention) left out; TB/s against the same byte floor\n");
      std::printf("%-8s %4s %7s | %8s %6s %9s %6s | %8s %6s %9s %6s\n", "case", "B", "nominal", "idx_us", "TB/s",
                  "nodecode", "TB/s", "sparse", "TB/s", "noexpand", "TB/s");
      for (int bsz : {8, 32, 128})
        for (int64_t nom : {100000, 200000}) {
          Case c{"probe", nom, {}, false};
          for (int len : decode_lengths(bsz, nom)) c.seqs.push_back({8, len});
          const Row r = run_case(dev, c, KvDType::kNVFP4, s);
          auto tbs = [](double bytes, double us) { return bytes / (us * 1e-6) / 1e12; };
          std::printf("%-8s %4d %7lld | %8.1f %6.2f %9.1f %6.2f | %8.1f %6.2f %9.1f %6.2f\n", "probe", r.batch,
                      static_cast<long long>(nom), r.idx_us, tbs(r.idx_bytes, r.idx_us), r.idx_probe_us,
                      tbs(r.idx_bytes, r.idx_probe_us), r.sparse_us, tbs(r.sparse_bytes, r.sparse_us),
                      r.sparse_probe_us, tbs(r.sparse_bytes, r.sparse_probe_us));
        }
    }
    if (want("prefill")) {
      std::printf("\nPrefill (vendor shapes; indexer FLOPs = 2*128*128*sum(history blocks) per row; attention FLOPs "
                  "= 4*Hq*128*selected keys)\n");
      std::printf("(mma TF/s, use%%: the NVFP4 row-group walk's tensor work, masked query columns included, and the "
                  "useful share of it)\n");
      std::printf("%-30s %-6s %6s %8s | %9s %7s | %8s %7s | %9s %7s %8s %5s\n", "case", "dtype", "T", "max_kv",
                  "idx_us", "TF/s", "topk_us", "%idx", "sparse_us", "TF/s", "mmaTF/s", "use%");
      for (KvDType dt : dtypes)
        for (size_t pi = 0; pi < prefill_shapes().size(); ++pi) {
          const PrefillShape& ps = prefill_shapes()[pi];
          if (!prefill_case.empty() ? std::string(ps.case_id).find(prefill_case) == std::string::npos
                                    : quick && pi % 2)
            continue;
          Case c{"prefill", 0, {}, false};
          int max_kv = 0, total_q = 0;
          for (size_t i = 0; i < ps.query_lens.size(); ++i) {
            c.seqs.push_back({ps.query_lens[i], ps.query_lens[i] + ps.prefix_lens[i]});
            max_kv = std::max(max_kv, ps.query_lens[i] + ps.prefix_lens[i]);
            total_q += ps.query_lens[i];
          }
          const Row r = run_case(dev, c, dt, s);
          std::printf("%-30s %-6s %6d %8d | %9.1f %7.1f | %8.1f %7.0f | %9.1f %7.1f", ps.case_id, r.dtype.c_str(),
                      total_q, max_kv, r.idx_us, r.idx_flops / (r.idx_us * 1e-6) / 1e12, r.topk_us,
                      100 * r.topk_us / r.idx_us, r.sparse_us, r.sparse_flops / (r.sparse_us * 1e-6) / 1e12);
          if (dt == KvDType::kNVFP4 && r.group_mma_flops > 0)
            std::printf(" %8.1f %5.0f\n", r.group_mma_flops / (r.sparse_us * 1e-6) / 1e12,
                        100 * r.sparse_flops / r.group_mma_flops);
          else
            std::printf(" %8s %5s\n", "-", "-");
        }
    }
    MSA_CUDA(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::printf("msa_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
