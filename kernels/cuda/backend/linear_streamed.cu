// The streamed skinny kernel: linear layers over items of at most 16 rows (decode steps, the
// routed experts of a decode step) at the memory system's pace.
//
// The skinny kernel (linear.cu) keeps its weight loads in registers, so a warp alternates between
// waiting for its loads and expanding them, and every CTA ends on a reduction while its SM's
// loads drain: it reads at 1.2-1.9 TB/s. Here a persistent CTA separates the two. A producer warp
// streams the weight rows (and their scale rows) of the CTA's work units into a ring of shared-
// memory stages with cp.async (one instruction per 512-byte row piece), running ahead across unit
// boundaries; eight consumer warps expand each stage to bf16 and run the same tensor-core MMAs as
// the skinny kernel. Two CTAs per SM keep 4-10 stages each in flight. (Bulk copies, the TMA's 1-D
// form, were slower: each takes its addresses from uniform registers, so a warp's 32 row copies
// are issued one lane at a time.) Measured: 1.7-2.3 TB/s on M3.1's experts, 17-30% above the
// skinny kernel; the consumers' expansion is now the limit (docs/gpu-backend-notes.md, session 16).
//
// A work unit is one item (<= 16 rows) x one 16-feature slice of the output, over all of K. A
// stage is K_s = 8 warps x 4 lanes x one 16-byte chunk of each of the 16 weight rows (512 bytes
// per row: 1,024 nvfp4, 512 fp8 and 256 bf16 elements), so consumer warp w always takes the w-th
// 64 bytes of every row of a stage. Each warp sums its chunks in stage order and the unit ends
// with the skinny kernel's fixed-order reduction over the warps: a row's sum order depends only
// on K, never on the batch (batch-invariant mode relies on it).
//
// Taken when every weight row and scale row is 16-byte aligned and scale rows are whole 16-byte
// words (nvfp4: K a multiple of 256; mxfp8: of 512), as M3's projections and experts are; other
// shapes stay on the skinny kernel.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/mbarrier.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kCtasPerSm = 2;
// Dynamic shared memory per CTA: two CTAs share an SM's 228 KB (1 KB of each is reserved).
constexpr int kSmemBudget = 112 * 1024;
constexpr int kUnitRows = 16;  // output features per unit: two 8-feature MMA tiles
constexpr int kStageRowBytes = kConsumerWarps * 4 * 16;

template <WeightKind F, bool kSwiglu>
struct StreamLayout {
  static constexpr int NW = kSwiglu ? 2 : 1;
  static constexpr int kElems = WeightFmt<F>::kElems;  // per 16-byte chunk
  static constexpr int kStageElems = kConsumerWarps * 4 * kElems;
  // Row pitch: 64 bytes past 512 put rows g and g + 1 of a quarter-warp's 16-byte loads on
  // different banks.
  static constexpr int kRowPitch = kStageRowBytes + 64;
  // Scale bytes per row and stage (nvfp4: one E4M3 per 16 elements; mxfp8: one UE8M0 per 32),
  // and their pitch (80: the 2-byte reads of 8 rows hit 8 different banks).
  static constexpr int kScaleBytes =
      F == WeightKind::kNvfp4 ? kStageElems / 16 : F == WeightKind::kMxfp8 ? kStageElems / 32 : 0;
  static constexpr int kScalePitch = F == WeightKind::kNvfp4 ? 80 : F == WeightKind::kMxfp8 ? 16 : 0;
  static constexpr int kWeightBytes = kUnitRows * (kRowPitch + kScalePitch);
  static constexpr int kStageBytes = NW * kWeightBytes;
  static constexpr int kSlots = NW * 2 * 4;  // accumulators per lane
  static constexpr int kRedBytes = kConsumerWarps * kSlots * 32 * 4;
  static constexpr int kBarrierBytes = 256;
  static constexpr int kStages = (kSmemBudget - kRedBytes - kBarrierBytes) / kStageBytes;
  static constexpr int kSmemBytes = kBarrierBytes + kRedBytes + kStages * kStageBytes;
  static_assert(kStages >= 3 && 2 * kStages * 8 <= kBarrierBytes);
};

template <WeightKind F>
__host__ __device__ constexpr int64_t data_bytes(int64_t elems) {
  return F == WeightKind::kNvfp4 ? elems / 2 : F == WeightKind::kBF16 ? 2 * elems : elems;
}

// One work unit as both roles see it.
struct StreamUnit {
  LinearItem item;
  int n0;       // first output feature of the slice (in its segment)
  int n_limit;  // features of the weight
  uint16_t* out;
  int64_t out_stride;
  WeightView w[2];
};

template <int NW>
__device__ __forceinline__ StreamUnit stream_unit(const LinearArgs& a, int u, int items) {
  StreamUnit s;
  const int index = u % items;  // items fastest: the row tiles of one slice run side by side
  int slice = u / items;
  if (a.items != nullptr) {
    s.item = a.items[index];
  } else {
    s.item.expert = 0;
    s.item.row_begin = index * kUnitRows;
    s.item.row_count = min(kUnitRows, a.rows - s.item.row_begin);
    s.item.pad = 0;
  }
#pragma unroll
  for (int j = 0; j < NW; ++j) s.w[j] = weight_of(a, j, s.item.expert);
  s.n_limit = a.n;
  s.out = a.out;
  s.out_stride = a.out_stride;
  if (a.num_segments > 0) {
    const int g = segment_of(a, slice);
    slice -= a.seg[g].slice_begin;
    s.n_limit = a.seg[g].n;
    s.out = a.seg[g].out;
    s.out_stride = a.seg[g].out_stride;
    s.w[0] = a.seg[g].w;
  }
  s.n0 = slice * kUnitRows;
  return s;
}

__device__ __forceinline__ int stream_items(const LinearArgs& a) {
  return a.items != nullptr ? *a.num_items : (a.rows + kUnitRows - 1) / kUnitRows;
}

template <WeightKind F, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) streamed_linear_kernel(const LinearArgs a, int slices) {
  using L = StreamLayout<F, kSwiglu>;
  constexpr int NW = L::NW, NT = 2, E = L::kElems, KC = 4 * E, SUBS = E / 8, S = L::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + S;
  float* red = reinterpret_cast<float*>(smem + L::kBarrierBytes);
  uint8_t* stages = smem + L::kBarrierBytes + L::kRedBytes;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 32);  // the producer lanes
      mbar_init(&empty[s], kConsumerWarps);
    }
  }
  __syncthreads();

  const int items = stream_items(a);
  const int units = items * slices;

  if (warp == kConsumerWarps) {
    // Producer: per stage, one cp.async instruction per weight row (32 lanes x 16 bytes = the
    // row's 512-byte piece, coalesced) and one per 8 (nvfp4) or 32 (mxfp8) scale rows.
    constexpr int kScaleChunks = L::kScaleBytes / 16;  // 16-byte words per scale row and stage
    constexpr int kScaleRowsPerOp = kScaleChunks > 0 ? 32 / kScaleChunks : 1;
    int stage = 0;
    uint32_t phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const StreamUnit un = stream_unit<NW>(a, u, items);
      const int rows = min(kUnitRows, un.n_limit - un.n0);
      for (int k0 = 0; k0 < a.k; k0 += L::kStageElems) {
        const int elems = min(L::kStageElems, a.k - k0);
        const int data_chunks = int(data_bytes<F>(elems) / 16);
        // The tail's scale bytes rounded up to a 16-byte word: inside the row, whose stride is
        // a multiple of 16 (streamed_linear_ok).
        const int scale_chunks = kScaleChunks == 0 ? 0 : (elems * L::kScaleBytes / L::kStageElems + 15) / 16;
        mbar_wait(&empty[stage], phase ^ 1u);
        uint8_t* dst = stages + stage * L::kStageBytes;
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          const WeightView& w = un.w[j];
          const uint8_t* src = w.data + int64_t(un.n0) * w.row_bytes + data_bytes<F>(k0) + 16 * lane;
          uint8_t* d = dst + j * L::kWeightBytes + 16 * lane;
          if (lane < data_chunks)
            for (int r = 0; r < rows; ++r) cp_async16(d + r * L::kRowPitch, src + r * w.row_bytes);
          if constexpr (kScaleChunks > 0) {
            const int c = lane % kScaleChunks;
            const uint8_t* ssrc = w.scale + int64_t(un.n0) * w.scale_stride + int64_t(k0) * L::kScaleBytes / L::kStageElems + 16 * c;
            uint8_t* sd = dst + j * L::kWeightBytes + kUnitRows * L::kRowPitch + 16 * c;
            if (c < scale_chunks)
              for (int r = lane / kScaleChunks; r < rows; r += kScaleRowsPerOp)
                cp_async16(sd + r * L::kScalePitch, ssrc + r * w.scale_stride);
          }
        }
        mbar_arrive_on_copies(&full[stage]);
        if (++stage == S) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
    return;
  }

  // Consumers.
  const int g = lane >> 2, q = lane & 3;
  int stage = 0;
  uint32_t phase = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const uint16_t* xrow[2];
    {
      const StreamUnit un = stream_unit<NW>(a, u, items);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        xrow[h] = row < un.item.row_count ? a.x + src_row(a, un.item.row_begin + row) * a.x_stride : nullptr;
      }
    }
    float acc[NW][NT][4];
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][nt][c] = 0.0f;

    for (int k0 = 0; k0 < a.k; k0 += L::kStageElems) {
      const int kl = warp * KC + q * E;  // the lane's chunk inside the stage
      const bool active = k0 + kl < a.k;
      // x before the wait where registers allow, so that its loads (L1 / L2) overlap it: two CTAs
      // per SM leave 96 registers, which the nvfp4 SwiGLU form (two weights, 4 x 2 x 16 bytes
      // of x per stage) would exceed by spilling.
      constexpr bool kXEarly = !(F == WeightKind::kNvfp4 && kSwiglu);
      uint4 xa[SUBS][2];
      auto load_x = [&] {
        // Branch-free: a row the item lacks (or a chunk past K) loads row 0's first elements, a
        // valid address, and is zeroed after.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool has = active && xrow[h] != nullptr;
          const uint16_t* p = has ? xrow[h] + k0 + kl : a.x;
#pragma unroll
          for (int s = 0; s < SUBS; ++s) {
            const uint4 v = *reinterpret_cast<const uint4*>(p + 8 * s);
            xa[s][h] = has ? v : make_uint4(0, 0, 0, 0);
          }
        }
      };
      if constexpr (kXEarly) load_x();
      mbar_wait(&full[stage], phase);
      uint4 raw[NW][NT];
      FastScale sc[NW][NT];
      const uint8_t* buf = stages + stage * L::kStageBytes;
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int row = nt * 8 + g;
          if (active) {
            raw[j][nt] = *reinterpret_cast<const uint4*>(buf + j * L::kWeightBytes + row * L::kRowPitch + warp * 64 + q * 16);
            const uint8_t* srow = buf + j * L::kWeightBytes + kUnitRows * L::kRowPitch + row * L::kScalePitch;
            if constexpr (F == WeightKind::kNvfp4)
              sc[j][nt] = fast_scale_of<F>(*reinterpret_cast<const uint16_t*>(srow + kl / 16));
            else if constexpr (F == WeightKind::kMxfp8)
              sc[j][nt] = fast_scale_of<F>(srow[kl / 32]);
            else
              sc[j][nt] = FastScale();
          } else {
            raw[j][nt] = make_uint4(0, 0, 0, 0);
            sc[j][nt] = FastScale();
          }
        }
      // The stage is in registers: hand it back before the arithmetic.
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == S) {
        stage = 0;
        phase ^= 1u;
      }
      if constexpr (!kXEarly) load_x();

      auto compute = [&](auto exact) {
        constexpr bool kExact = decltype(exact)::value;
#pragma unroll
        for (int s = 0; s < SUBS; ++s)
#pragma unroll
          for (int j = 0; j < NW; ++j)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
              mma_sub(acc[j][nt], xa[s][0], xa[s][1], expand_sub<F, kExact>(raw[j][nt], s, sc[j][nt]));
      };
      if constexpr (F == WeightKind::kMxfp8) {
        uint32_t top = 0;
#pragma unroll
        for (int j = 0; j < NW; ++j)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) top = max(top, sc[j][nt].pair[0]);
        if (__any_sync(0xFFFFFFFFu, top > mx_fast_pair(kMxfp8FastMaxExp))) {
          compute(std::true_type());
          continue;
        }
      }
      compute(std::false_type());
    }

    // The unit's fixed-order reduction over the consumer warps, then the epilogue (one output
    // element per consumer thread: 16 rows x 16 features). The unit is looked up again rather
    // than kept in registers through the K loop.
    const StreamUnit un = stream_unit<NW>(a, u, items);
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float v = acc[j][nt][c];
          if constexpr (F == WeightKind::kNvfp4) v *= float(1 << kNvfp4AccShift);  // decode_sub_fast's 2^-8
          red[(warp * L::kSlots + (j * NT + nt) * 4 + c) * 32 + lane] = v;
        }
    named_barrier_sync(1, kConsumerWarps * 32);
    {
      const int e = threadIdx.x;  // < 256 = NT x 4 x 32
      const int ln = e & 31, c = (e >> 5) & 3, nt = e >> 7;
      const int row = (ln >> 2) + (c >= 2 ? 8 : 0);
      const int col = un.n0 + nt * 8 + 2 * (ln & 3) + (c & 1);
      if (row < un.item.row_count && col < un.n_limit) {
        float v[NW];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          const int slot = (j * NT + nt) * 4 + c;
          float sum = red[slot * 32 + ln];
#pragma unroll
          for (int wi = 1; wi < kConsumerWarps; ++wi) sum += red[(wi * L::kSlots + slot) * 32 + ln];
          v[j] = sum;
        }
        const float y = epilogue_value<kSwiglu>(a, un.w, v);
        un.out[int64_t(un.item.row_begin + row) * un.out_stride + col] = f32_to_bf16_bits(y);
      }
    }
    named_barrier_sync(1, kConsumerWarps * 32);  // red is rewritten by the next unit
  }
}

template <WeightKind F, bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int max_items, cudaStream_t stream) {
  using L = StreamLayout<F, kSwiglu>;
  const int slices = linear_slices(a);
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const int64_t units = int64_t(max_items) * slices;
  const int grid = int(std::min<int64_t>(units, int64_t(sms) * kCtasPerSm));
  if (grid <= 0) return cudaSuccess;
  streamed_linear_kernel<F, kSwiglu><<<grid, kThreads, L::kSmemBytes, stream>>>(a, slices);
  return cudaGetLastError();
}

template <bool kSwiglu>
cudaError_t launch_epilogue(const LinearArgs& a, int max_items, cudaStream_t stream) {
  return dispatch_mma_kind(a.w[0].kind,
                           [&](auto kind) { return launch_kind<decltype(kind)::value, kSwiglu>(a, max_items, stream); });
}

template <WeightKind F>
cudaError_t set_smem_limit() {
  cudaError_t e = cudaFuncSetAttribute(streamed_linear_kernel<F, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       StreamLayout<F, false>::kSmemBytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(streamed_linear_kernel<F, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              StreamLayout<F, true>::kSmemBytes);
}

bool scale_rows_ok(const WeightView& w) {
  if (w.kind != WeightKind::kNvfp4 && w.kind != WeightKind::kMxfp8) return true;
  return w.scale != nullptr && reinterpret_cast<uintptr_t>(w.scale) % 16 == 0 && w.scale_stride % 16 == 0;
}

}  // namespace

bool streamed_weight_ok(const WeightView& w) {
  switch (w.kind) {
    case WeightKind::kBF16:
    case WeightKind::kFp8:
    case WeightKind::kMxfp8:
    case WeightKind::kNvfp4:
      break;
    default:
      return false;
  }
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.row_bytes % 16 == 0 && scale_rows_ok(w);
}

bool streamed_linear_ok(const LinearArgs& a) {
  if (a.item_rows != kUnitRows || a.x_stride % 8 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return false;
  if (a.table[0] != nullptr) return a.table_streamed_ok;
  if (a.num_segments > 0) {
    for (int s = 0; s < a.num_segments; ++s)
      if (!streamed_weight_ok(a.seg[s].w)) return false;
    return true;
  }
  return streamed_weight_ok(a.w[0]) && (a.epilogue != Epilogue::kSwiglu || streamed_weight_ok(a.w[1]));
}

cudaError_t init_linear_streamed_kernels() {
  cudaError_t e;
  if ((e = set_smem_limit<WeightKind::kBF16>()) != cudaSuccess) return e;
  if ((e = set_smem_limit<WeightKind::kFp8>()) != cudaSuccess) return e;
  if ((e = set_smem_limit<WeightKind::kMxfp8>()) != cudaSuccess) return e;
  return set_smem_limit<WeightKind::kNvfp4>();
}

cudaError_t launch_linear_streamed(const LinearArgs& a, int max_items, cudaStream_t stream) {
  return a.epilogue == Epilogue::kSwiglu ? launch_epilogue<true>(a, max_items, stream)
                                         : launch_epilogue<false>(a, max_items, stream);
}

}  // namespace m3::cuda::detail
