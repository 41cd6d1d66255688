// The backend-ops check (llama.cpp's test-backend-ops in spirit): every op of ops/backend.h on
// random inputs, CUDA backend against the CPU reference in bf16 mode, over two geometries (the M3
// shape, which takes the MSA kernels, and a tiny one, which takes the generic kernels), every
// weight format and KV dtype, several row counts (skinny, tiled and SIMT linear paths). One line
// per case: the error, the tolerance, PASS/FAIL.
#include <algorithm>
#include <climits>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "formats/bf16.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/backend/cuda_backend.h"
#include "kernels/cuda/backend/device_memory.h"
#include "tests/support/simple_kv_allocator.h"
#include "ops/kv_layout.h"
#include "tests/kernels_cuda/backend_checks.h"
#include "tests/kernels_cuda/backend_testing.h"

namespace m3::test {
namespace {

// Tolerances (max |cuda - cpu| / max |cpu| over an op's output). Outputs are bf16 (relative step
// 2^-8); the backends differ only in fp32 summation order, so an element that lands on the other
// side of a bf16 rounding boundary differs by one bf16 step of itself.
constexpr double kTolExact = 0.0;
constexpr double kTolRounding = 8e-3;  // one bf16 step, relative to the output's scale
constexpr double kTolGemm = 1.2e-2;    // + fp32 order over long dot products
// The nvfp4 (Q8KV4) probability path of the MSA kernels: section 5 of msa-kernels.md allows 3e-2
// (prefill rows) and 5e-2 (decode rows) per element; these steps mix both.
constexpr double kTolQ8KV4 = 5e-2;

struct Steps {
  StepBatch history;  // every cached position before the step
  StepBatch step;     // the step's tokens (the last q_len positions of each sequence)
};

// Sequences of the given (seq_len, q_len), blocks from one allocator.
Steps make_steps(int block_size, int64_t num_blocks, const std::vector<std::pair<int, int>>& seqs) {
  SimpleKvAllocator alloc(num_blocks, block_size);
  std::vector<StepChunk> hist, step;
  std::vector<int> ids;
  for (size_t i = 0; i < seqs.size(); ++i) ids.push_back(alloc.add_sequence());
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t> toks(seqs[i].first - seqs[i].second);
    for (size_t j = 0; j < toks.size(); ++j) toks[j] = int32_t((j * 7 + i) % 997);
    if (!toks.empty()) hist.push_back({ids[i], toks, true});
  }
  Steps s;
  if (!hist.empty()) s.history = alloc.build_step(hist);
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<int32_t> toks(seqs[i].second);
    for (size_t j = 0; j < toks.size(); ++j) toks[j] = int32_t((j * 13 + 5 * i + 1) % 997);
    step.push_back({ids[i], toks, true});
  }
  s.step = alloc.build_step(step);
  return s;
}

struct Pair {
  std::unique_ptr<Backend> cpu, gpu;
  Pair(const ModelConfig& config) : cpu(make_cpu_backend()), gpu(make_cuda_backend()) {
    cpu->configure(backend_config(config, DType::kBF16));
    gpu->configure(backend_config(config, DType::kBF16));
  }
  void plan(const StepBatch& b) {
    cpu->plan(b);
    gpu->plan(b);
  }
};

// ---------------------------------------------------------------------------------------------

void check_elementwise(Report& rep, const Geometry& g, std::mt19937_64& rng) {
  const ModelConfig config = make_config(g);
  Pair p(config);
  const Steps s = make_steps(g.block_size, 64, {{3000 % (g.block_size * 40) + 37, 37}});
  p.plan(s.step);
  const int t = s.step.num_tokens(), h = g.hidden;
  const std::string tag = g.name;

  {  // embed (bf16 table)
    std::vector<float> table = random_values(rng, size_t(1000) * h, 1.0f);
    Tensor host = Tensor::zeros({1000, h}, DType::kBF16);
    for (size_t i = 0; i < table.size(); ++i) host.data_as<uint16_t>()[i] = bf16_encode(table[i]);
    Tensor dev = to_device(host);
    Tensor co = p.cpu->alloc({t, h}, DType::kF32), go = p.gpu->alloc({t, h}, DType::kBF16);
    p.cpu->embed(host, co);
    p.gpu->embed(dev, go);
    rep.add(tag + " embed bf16", compare(read_device(go), read_host(co)).rel(), kTolExact);
  }
  const std::vector<float> xv = random_values(rng, size_t(t) * h, 2.0f);
  {  // rms_norm + gather + add
    std::vector<float> w = random_values(rng, h, 0.3f);
    Tensor wh = Tensor::zeros({h}, DType::kF32);
    std::copy(w.begin(), w.end(), wh.data_as<float>());
    Tensor wd = to_device(wh);
    Tensor cx = host_act(xv, t, h), gx = device_act(xv, t, h);
    Tensor co = p.cpu->alloc({t, h}, DType::kF32), go = p.gpu->alloc({t, h}, DType::kBF16);
    p.cpu->rms_norm(cx, wh, 1e-6f, co);
    p.gpu->rms_norm(gx, wd, 1e-6f, go);
    rep.add(tag + " rms_norm", compare(read_device(go), read_host(co)).rel(), kTolRounding);
    const int rows = static_cast<int>(s.step.logits_rows.size());
    Tensor cg = p.cpu->alloc({rows, h}, DType::kF32), gg = p.gpu->alloc({rows, h}, DType::kBF16);
    p.cpu->gather_logits_rows(co, cg);
    p.gpu->gather_logits_rows(go, gg);
    rep.add(tag + " gather_logits_rows", compare(read_device(gg), read_host(cg)).rel(), kTolRounding);
    p.cpu->add_inplace(cx, co);
    p.gpu->add_inplace(gx, go);
    rep.add(tag + " add_inplace", compare(read_device(gx), read_host(cx)).rel(), kTolRounding);
    // add_rms_norm: against the CPU reference, and bitwise against the GPU's own add + rms_norm
    // kernels (the fused kernel's promise), with out aliasing y as the model calls it.
    const std::vector<float> yv = random_values(rng, size_t(t) * h, 2.0f);
    Tensor cy = host_act(yv, t, h), gy = device_act(yv, t, h);
    Tensor gx2 = device_act(xv, t, h), gy2 = device_act(yv, t, h);
    p.cpu->add_rms_norm(cx, cy, wh, 1e-6f, cy);
    p.gpu->add_rms_norm(gx, gy, wd, 1e-6f, gy);
    rep.add(tag + " add_rms_norm residual", compare(read_device(gx), read_host(cx)).rel(), kTolRounding);
    rep.add(tag + " add_rms_norm", compare(read_device(gy), read_host(cy)).rel(), kTolRounding);
    p.gpu->add_inplace(gx2, go);  // gx2 = gx before the fused op
    p.gpu->add_inplace(gx2, gy2);
    p.gpu->rms_norm(gx2, wd, 1e-6f, gy2);
    rep.add(tag + " add_rms_norm residual vs add_inplace", compare(read_device(gx), read_device(gx2)).rel(), kTolExact);
    rep.add(tag + " add_rms_norm vs add_inplace + rms_norm", compare(read_device(gy), read_device(gy2)).rel(),
            kTolExact);
  }
  // head_norm_rope: query heads over rotary_dim, index heads over min(rotary_dim, index_dim).
  for (const auto& [heads, dim, rope] : {std::tuple{g.heads, g.head_dim, g.rotary_dim},
                                         std::tuple{g.index_heads, g.index_dim, std::min(g.rotary_dim, g.index_dim)}}) {
    if (heads == 0 || dim == 0) continue;
    std::vector<float> v = random_values(rng, size_t(t) * heads * dim, 3.0f);
    std::vector<float> w = random_values(rng, dim, 0.5f);
    Tensor wh = Tensor::zeros({dim}, DType::kF32);
    std::copy(w.begin(), w.end(), wh.data_as<float>());
    Tensor cx = host_act(v, t, int64_t(heads) * dim), gx = device_act(v, t, int64_t(heads) * dim);
    p.cpu->head_norm_rope(cx, heads, dim, wh, 1e-6f, rope);
    p.gpu->head_norm_rope(gx, heads, dim, to_device(wh), 1e-6f, rope);
    rep.add(fmt::format("{} head_norm_rope {}x{} rope {}", tag, heads, dim, rope),
            compare(read_device(gx), read_host(cx)).rel(), kTolRounding);
  }
}

// ---------------------------------------------------------------------------------------------

struct FormatCase {
  const char* name;
  WeightFormat format;
  DType dense = DType::kBF16;
  float divisor = 0.0f;
};
const FormatCase kFormats[] = {
    {"bf16", WeightFormat::kDense, DType::kBF16},    {"f32", WeightFormat::kDense, DType::kF32},
    {"f16", WeightFormat::kDense, DType::kF16},      {"fp8", WeightFormat::kFp8},
    {"fp8-block", WeightFormat::kFp8Block},          {"mxfp8", WeightFormat::kMxfp8},
    {"nvfp4-modelopt", WeightFormat::kNvfp4},        {"nvfp4-ct", WeightFormat::kNvfp4, DType::kBF16, 448.0f * 6.0f * 8.0f},
};

void check_linear(Report& rep, std::mt19937_64& rng, bool quick) {
  const ModelConfig config = make_config({"lin", 256, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32});
  Pair p(config);
  const std::vector<int> row_counts = quick ? std::vector<int>{1, 20, 150} : std::vector<int>{1, 3, 16, 20, 64, 150, 300};
  const std::vector<std::pair<int, int>> shapes = {{256, 512}, {96, 256}, {40, 96}};
  for (const FormatCase& f : kFormats) {
    for (const auto& [n, k] : shapes) {
      if (f.format == WeightFormat::kNvfp4 && k % 16) continue;
      const LinearWeight w = random_linear(rng, "w", n, k, f.format, f.dense, f.divisor);
      const LinearWeight wd = upload_linear(w);
      for (int rows : row_counts) {
        std::vector<float> x = random_values(rng, size_t(rows) * k, 1.0f);
        Tensor co = p.cpu->alloc({rows, n}, DType::kF32), go = p.gpu->alloc({rows, n}, DType::kBF16);
        p.cpu->linear(host_act(x, rows, k), w, co);
        p.gpu->linear(device_act(x, rows, k), wd, go);
        rep.add(fmt::format("linear {} {}x{} rows {}", f.name, n, k, rows), compare(read_device(go), read_host(co)).rel(),
                kTolGemm);
      }
      // A prefill-sized problem: 16 row tiles of the wgmma kernel, several K steps.
      if (quick || n != 256) continue;
      const int rows = 2048;
      std::vector<float> x = random_values(rng, size_t(rows) * k, 1.0f);
      Tensor co = p.cpu->alloc({rows, n}, DType::kF32), go = p.gpu->alloc({rows, n}, DType::kBF16);
      p.cpu->linear(host_act(x, rows, k), w, co);
      p.gpu->linear(device_act(x, rows, k), wd, go);
      rep.add(fmt::format("linear {} {}x{} rows {}", f.name, n, k, rows), compare(read_device(go), read_host(co)).rel(),
              kTolGemm);
    }
  }
}

void check_swiglu(Report& rep, std::mt19937_64& rng, bool quick) {
  const ModelConfig config = make_config({"mlp", 256, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32});
  Pair p(config);
  const int hidden = 256, inter = 192;
  for (const FormatCase& f : kFormats) {
    if (quick && f.format == WeightFormat::kFp8Block) continue;
    const LinearWeight g = random_linear(rng, "gate", inter, hidden, f.format, f.dense, f.divisor);
    const LinearWeight u = random_linear(rng, "up", inter, hidden, f.format, f.dense, f.divisor);
    const LinearWeight d = random_linear(rng, "down", hidden, inter, f.format, f.dense, f.divisor);
    const LinearWeight gd = upload_linear(g), ud = upload_linear(u), dd = upload_linear(d);
    // 600 rows: above the skinny kernel's 256-row dense limit, the wgmma kernel's fused SwiGLU.
    for (int rows : {1, 17, 200, 600}) {
      std::vector<float> x = random_values(rng, size_t(rows) * hidden, 1.5f);
      Tensor co = p.cpu->alloc({rows, hidden}, DType::kF32), go = p.gpu->alloc({rows, hidden}, DType::kBF16);
      p.cpu->swiglu_mlp(host_act(x, rows, hidden), g, u, d, 1.702f, 7.0f, co);
      p.gpu->swiglu_mlp(device_act(x, rows, hidden), gd, ud, dd, 1.702f, 7.0f, go);
      rep.add(fmt::format("swiglu_mlp {} rows {}", f.name, rows), compare(read_device(go), read_host(co)).rel(),
              kTolGemm);
    }
  }
}

void check_moe(Report& rep, std::mt19937_64& rng, bool quick) {
  struct MoeCase {
    const char* name;
    int experts, top_k;
    FormatCase routed, shared;
  };
  const MoeCase cases[] = {
      {"nvfp4-ct experts, mxfp8 shared", 16, 4, kFormats[7], kFormats[5]},
      {"nvfp4-modelopt experts, bf16 shared", 8, 2, kFormats[6], kFormats[0]},
      {"f32 experts (simt), f32 shared", 8, 2, kFormats[1], kFormats[1]},
  };
  const int hidden = 256, inter = 128;
  const ModelConfig config = make_config({"moe", hidden, 4, 2, 64, 0, 0, 16, 4, 1, 0, 32});
  Pair p(config);
  for (const MoeCase& mc : cases) {
    MlpWeights host, dev;
    host.gate = random_linear(rng, "shared.gate", inter, hidden, mc.shared.format, mc.shared.dense, mc.shared.divisor);
    host.up = random_linear(rng, "shared.up", inter, hidden, mc.shared.format, mc.shared.dense, mc.shared.divisor);
    host.down = random_linear(rng, "shared.down", hidden, inter, mc.shared.format, mc.shared.dense, mc.shared.divisor);
    dev.gate = upload_linear(host.gate);
    dev.up = upload_linear(host.up);
    dev.down = upload_linear(host.down);
    std::vector<float> router = random_values(rng, size_t(mc.experts) * hidden, 0.08f);
    host.router = Tensor::zeros({mc.experts, hidden}, DType::kF32);
    std::copy(router.begin(), router.end(), host.router.data_as<float>());
    host.router_bias = Tensor::zeros({mc.experts}, DType::kF32);
    for (int e = 0; e < mc.experts; ++e) host.router_bias.data_as<float>()[e] = 0.01f * float(e % 5);
    dev.router = to_device(host.router);
    dev.router_bias = to_device(host.router_bias);
    for (int e = 0; e < mc.experts; ++e) {
      const FormatCase& f = mc.routed;
      ExpertWeights ew{random_linear(rng, "e.gate", inter, hidden, f.format, f.dense, f.divisor),
                       random_linear(rng, "e.up", inter, hidden, f.format, f.dense, f.divisor),
                       random_linear(rng, "e.down", hidden, inter, f.format, f.dense, f.divisor)};
      host.experts.push_back(ew);
      dev.experts.push_back({upload_linear(ew.gate), upload_linear(ew.up), upload_linear(ew.down)});
    }
    MoeParams params;
    params.num_experts = mc.experts;
    params.experts_per_token = mc.top_k;
    params.routed_scaling_factor = 2.0f;
    for (int rows : quick ? std::vector<int>{1, 40} : std::vector<int>{1, 5, 40, 300, 2048}) {
      std::vector<float> x = random_values(rng, size_t(rows) * hidden, 1.0f);
      Tensor co = p.cpu->alloc({rows, hidden}, DType::kF32), go = p.gpu->alloc({rows, hidden}, DType::kBF16);
      p.cpu->moe(host_act(x, rows, hidden), host, params, co);
      p.gpu->moe(device_act(x, rows, hidden), dev, params, go);
      rep.add(fmt::format("moe {} E{} k{} rows {}", mc.name, mc.experts, mc.top_k, rows),
              compare(read_device(go), read_host(co)).rel(), kTolGemm);
    }
  }
}

// ---------------------------------------------------------------------------------------------

// Sorts each selection row's valid ids ascending (-1 last): the CPU lists them by score, the MSA
// kernels by id; the attention ops take either.
void sort_selection(std::vector<int32_t>& sel, int topk) {
  for (size_t r = 0; r + topk <= sel.size(); r += topk)
    std::sort(sel.begin() + r, sel.begin() + r + topk, [](int32_t a, int32_t b) {
      return (a < 0 ? INT32_MAX : a) < (b < 0 ? INT32_MAX : b);
    });
}

void check_attention(Report& rep, const Geometry& g, KvDType kv, std::mt19937_64& rng, bool quick) {
  const ModelConfig config = make_config(g);
  Pair p(config);
  const bool m3 = g.head_dim == 128;
  const std::vector<std::pair<int, int>> seqs =
      m3 ? (quick ? std::vector<std::pair<int, int>>{{300, 1}, {2100, 4}, {2200, 24}}
                  : std::vector<std::pair<int, int>>{{300, 1}, {2100, 4}, {2500, 64}, {4000, 1}})
         : std::vector<std::pair<int, int>>{{20, 1}, {90, 3}, {150, 40}};
  const int64_t num_blocks = 96;
  const Steps s = make_steps(g.block_size, num_blocks, seqs);
  const KvLayout layout = KvLayout::make(g.block_size, g.kv_heads, g.head_dim, g.index_dim, kv, kv, {true});
  Tensor cpu_pool = Tensor::zeros({layout.block_bytes * num_blocks}, DType::kU8);
  const KvLayerView cview = layout.layer_view(cpu_pool.data_as<uint8_t>(), 0);
  const std::string tag = fmt::format("{} kv {}", g.name, kv_dtype_name(kv));
  const int kv_cols = g.kv_heads * g.head_dim;

  // History: random K, V, index-K through the CPU reference.
  {
    const int th = s.history.num_tokens();
    p.cpu->plan(s.history);
    p.cpu->kv_insert(cview, host_act(random_values(rng, size_t(th) * kv_cols, 1.0f), th, kv_cols),
                     host_act(random_values(rng, size_t(th) * kv_cols, 1.0f), th, kv_cols),
                     host_act(random_values(rng, size_t(th) * g.index_dim, 1.0f), th, g.index_dim));
  }
  Tensor gpu_pool = to_device(cpu_pool);
  const KvLayerView gview = layout.layer_view(gpu_pool.data_as<uint8_t>(), 0);
  p.plan(s.step);
  const int t = s.step.num_tokens();
  auto pool_mismatch = [&]() {
    const std::vector<uint8_t> a = read_bytes(cpu_pool), b = read_bytes(gpu_pool);
    int64_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) bad += a[i] != b[i];
    return double(bad);
  };

  // Fused input path (q, k, v, index-K pre-norm) against the reference's separate ops.
  {
    const std::vector<float> q = random_values(rng, size_t(t) * g.heads * g.head_dim, 2.0f);
    const std::vector<float> k = random_values(rng, size_t(t) * kv_cols, 2.0f);
    const std::vector<float> v = random_values(rng, size_t(t) * kv_cols, 1.0f);
    const std::vector<float> ik = random_values(rng, size_t(t) * g.index_dim, 2.0f);
    auto norm = [&](int n) {
      Tensor w = Tensor::zeros({n}, DType::kF32);
      const std::vector<float> r = random_values(rng, n, 0.3f);
      std::copy(r.begin(), r.end(), w.data_as<float>());
      return w;
    };
    const Tensor qn = norm(g.head_dim), kn = norm(g.head_dim), ikn = norm(g.index_dim);
    const int index_rope = std::min(g.rotary_dim, g.index_dim);
    Tensor cq = host_act(q, t, int64_t(g.heads) * g.head_dim), ck = host_act(k, t, kv_cols),
           cik = host_act(ik, t, g.index_dim);
    Tensor gq = device_act(q, t, int64_t(g.heads) * g.head_dim), gk = device_act(k, t, kv_cols),
           gik = device_act(ik, t, g.index_dim);
    p.cpu->attention_input(cview, cq, g.heads, ck, host_act(v, t, kv_cols), qn, kn, cik, ikn, 1e-6f, g.rotary_dim,
                           index_rope);
    p.gpu->attention_input(gview, gq, g.heads, gk, device_act(v, t, kv_cols), to_device(qn), to_device(kn), gik,
                           to_device(ikn), 1e-6f, g.rotary_dim, index_rope);
    rep.add(tag + " attention_input q", compare(read_device(gq), read_host(cq)).rel(), kTolRounding);
    rep.add(tag + " attention_input k", compare(read_device(gk), read_host(ck)).rel(), kTolRounding);
    rep.add(tag + " attention_input index_k", compare(read_device(gik), read_host(cik)).rel(), kTolRounding);
    // Cache bytes: exact when the normed rows agree exactly; count differing bytes.
    rep.add(tag + " attention_input cache bytes differing", pool_mismatch(), 64.0);
    // kv_insert of the same (normed) rows, from identical inputs: bit-exact.
    Tensor ck2 = host_act(read_device(gk), t, kv_cols), cik2 = host_act(read_device(gik), t, g.index_dim);
    const std::vector<float> v2 = random_values(rng, size_t(t) * kv_cols, 1.0f);
    p.cpu->kv_insert(cview, ck2, host_act(v2, t, kv_cols), cik2);
    p.gpu->kv_insert(gview, gk, device_act(v2, t, kv_cols), gik);
    rep.add(tag + " kv_insert cache bytes differing", pool_mismatch(), kTolExact);
  }
  // From here on both pools hold the same bytes (the GPU copy is the reference's).
  gpu_pool = to_device(cpu_pool);
  const KvLayerView gview2 = layout.layer_view(gpu_pool.data_as<uint8_t>(), 0);

  IndexerParams ip;
  ip.index_heads = g.index_heads;
  ip.topk_blocks = g.topk;
  ip.local_blocks = g.local_blocks;
  ip.init_blocks = g.init_blocks;
  const int sel_n = t * g.index_heads * g.topk;
  std::vector<int32_t> cpu_sel;
  {
    const std::vector<float> iq = random_values(rng, size_t(t) * g.index_heads * g.index_dim, 1.0f);
    Tensor csel = Tensor::zeros({sel_n}, DType::kI32);
    Tensor gsel = p.gpu->alloc({sel_n}, DType::kI32);
    p.cpu->indexer_topk(cview, host_act(iq, t, int64_t(g.index_heads) * g.index_dim), ip, csel);
    p.gpu->indexer_topk(gview2, device_act(iq, t, int64_t(g.index_heads) * g.index_dim), ip, gsel);
    cpu_sel.assign(csel.data_as<int32_t>(), csel.data_as<int32_t>() + sel_n);
    std::vector<uint8_t> gb = read_bytes(gsel);
    std::vector<int32_t> gpu_sel(sel_n);
    std::memcpy(gpu_sel.data(), gb.data(), gb.size());
    sort_selection(cpu_sel, g.topk);
    sort_selection(gpu_sel, g.topk);
    int bad_rows = 0;
    for (int r = 0; r < t * g.index_heads; ++r)
      bad_rows += !std::equal(cpu_sel.begin() + r * g.topk, cpu_sel.begin() + (r + 1) * g.topk, gpu_sel.begin() + r * g.topk);
    // Near-ties of block scores may order differently under another summation order.
    rep.add(tag + " indexer_topk rows differing (of " + std::to_string(t * g.index_heads) + ")", bad_rows,
            std::max(1.0, 0.02 * t * g.index_heads));
  }
  const float sm_scale = 1.0f / std::sqrt(float(g.head_dim));
  const double tol = kv == KvDType::kNVFP4 ? kTolQ8KV4 : kTolGemm;
  for (bool sparse : {true, false}) {
    const std::vector<float> q = random_values(rng, size_t(t) * g.heads * g.head_dim, 1.0f);
    const int64_t cols = int64_t(g.heads) * g.head_dim;
    Tensor csel, gsel;
    if (sparse) {
      csel = Tensor::zeros({sel_n}, DType::kI32);
      std::copy(cpu_sel.begin(), cpu_sel.end(), csel.data_as<int32_t>());
      gsel = to_device(csel);
    }
    Tensor co = p.cpu->alloc({t, cols}, DType::kF32), go = p.gpu->alloc({t, cols}, DType::kBF16);
    p.cpu->paged_attention(cview, host_act(q, t, cols), g.heads, csel, g.topk, sm_scale, co);
    p.gpu->paged_attention(gview2, device_act(q, t, cols), g.heads, gsel, g.topk, sm_scale, go);
    rep.add(tag + (sparse ? " paged_attention sparse" : " paged_attention dense"),
            compare(read_device(go), read_host(co)).rel(), tol);
  }
}

}  // namespace

void run_ops_checks(Report& rep, bool quick, uint64_t seed, const std::string& only) {
  std::mt19937_64 rng(seed);
  const Geometry m3{"m3", 512, 32, 2, 128, 2, 128, 128, 16, 1, 0, 64};
  const Geometry tiny{"tiny", 64, 4, 2, 64, 2, 32, 16, 4, 2, 1, 32};
  // A group that throws (a failed launch, a contract check) is reported and the next one runs;
  // after a sticky CUDA error (illegal address) every later group reports the same error.
  // `only` (a substring of a group's name) runs one group: the script runs each group in its own
  // process, so a sticky CUDA error costs one group, not the rest.
  auto guarded = [&](const std::string& what, const std::function<void()>& f) {
    if (!only.empty() && what.find(only) == std::string::npos) return;
    try {
      f();
    } catch (const std::exception& e) {
      rep.add(what + " ERROR: " + e.what(), INFINITY, 0.0);
    }
  };
  for (const Geometry& g : {m3, tiny}) guarded(g.name + " elementwise", [&] { check_elementwise(rep, g, rng); });
  guarded("linear", [&] { check_linear(rep, rng, quick); });
  guarded("swiglu_mlp", [&] { check_swiglu(rep, rng, quick); });
  guarded("moe", [&] { check_moe(rep, rng, quick); });
  guarded("sampling", [&] { run_sampling_checks(rep, quick, seed); });
  for (const Geometry& g : {m3, tiny})
    for (KvDType kv : {KvDType::kF32, KvDType::kBF16, KvDType::kFP8, KvDType::kNVFP4}) {
      if (quick && kv == KvDType::kF32 && g.head_dim == 128) continue;
      guarded(fmt::format("{} attention kv {}", g.name, kv_dtype_name(kv)),
              [&] { check_attention(rep, g, kv, rng, quick); });
    }
}

}  // namespace m3::test
