// The streamed skinny kernel: linear layers over items of at most 64 rows (decode steps, the
// routed experts of a decode step, dense layers up to 32 rows and narrow ones up to 256) at the
// memory system's pace.
//
// The skinny kernel (linear.cu) keeps its weight loads in registers, so a warp alternates between
// waiting for its loads and expanding them, and every CTA ends on a reduction while its SM's
// loads drain: it reads at 1.2-1.9 TB/s. Here a persistent CTA separates the two. A producer warp
// streams the weight rows (and their scale rows) of the CTA's work units into a ring of shared-
// memory stages with cp.async (immediate-offset copies of 64 bytes of 8 rows each), running ahead
// across unit boundaries; eight consumer warps expand each stage to bf16 with the skinny kernel's
// decoders and run tensor-core MMAs with the weights as the A operand (16 features) and the x rows
// as B (8 tokens per tile), so that an item of up to 8 rows costs half the MMAs and x loads. Two
// CTAs per SM (one in the wide form) keep 3-11 stages each in flight. The producer also writes each
// unit's header (rows, x rows, outputs) into a ring of its own, and a unit's epilogue runs inside
// the next unit, so consumers neither look units up in global memory nor wait at a block-wide
// barrier. (Bulk copies, the TMA's 1-D form, were slower: each takes its addresses from uniform
// registers, so a warp's 32 row copies are issued one lane at a time.) Measured on M3.1's routed
// experts: gate/up 2.4-3.2 TB/s, down 1.8-2.8 TB/s, 1.3-2.0x the skinny kernel
// (docs/gpu-backend-notes.md, sessions 16 and 17).
//
// A work unit is one chunk of an item's tokens (<= 16 narrow, <= 32 wide) x two halves of 16 weight
// rows (a SwiGLU pair's gate and up rows of one 16-feature slice, or two consecutive slices of a
// store), over all of K. A stage is K_s = 8 warps x 4 lanes x one 16-byte chunk of each weight row
// (512 bytes per row: 1,024 nvfp4, 512 fp8 and 256 bf16 elements), so consumer warp w always takes
// the w-th 64 bytes of every row of a stage. Each warp sums its chunks in stage order and the unit
// ends with a fixed-order reduction over the warps: a row's sum order depends only on K, never on
// the batch (batch-invariant mode, whose 16-row items all take the narrow form, relies on it).
//
// Taken when every weight row and scale row is 16-byte aligned and scale rows are whole 16-byte
// words (nvfp4: K a multiple of 256; mxfp8: of 512), as M3's projections and experts are; other
// shapes stay on the skinny kernel.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "kernels/cuda/backend/backend_kernels.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/linear_common.cuh"
#include "kernels/cuda/backend/mbarrier.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace m3::cuda::detail {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kUnitRows = 16;  // output features per unit half: two 8-feature MMA tiles

// The two forms of the kernel, by the token tiles (8 tokens each) a unit may hold: the narrow one
// (items of <= 16 rows: decode steps, routed experts) runs two CTAs an SM; the wide one (items
// of 32 or 64 rows, cut into 32-token chunks: dense layers of batch 17-32, narrow ones up to 256
// (linear_item_rows), experts with more than 16 rows) one, so that a thread has the registers for
// 4 token tiles' accumulators (65,536 / (9 warps x 32) -> 168 where two CTAs leave 96; 8 tiles
// would spill) and the shared memory for their reduction. An SM has 228 KB of shared memory, 1 KB
// of it reserved per CTA.
template <int TTMAX>
struct StreamForm {
  static constexpr int kTokens = 8 * TTMAX;
  static constexpr int kCtasPerSm = TTMAX <= 2 ? 2 : 1;
  static constexpr int kSmemBudget = TTMAX <= 2 ? 112 * 1024 : 224 * 1024;
};
constexpr int kStageRowBytes = kConsumerWarps * 4 * 16;

// A unit's output half: 16 features from n0 of a weight of n_limit features, stored to out.
struct HalfHeader {
  uint16_t* out;
  int64_t out_stride;
  int n0, n_limit;
  OutScale scale;
};

// What the consumers need of a unit, written by the producer into a ring of headers (so that
// consumers never look units up in global memory): its item's rows, each token's x row (element
// offset; a token the item lacks reads the first row), and its two halves' outputs.
template <int TTMAX>
struct alignas(64) UnitHeader {
  int64_t xoff[StreamForm<TTMAX>::kTokens];
  HalfHeader half[2];
  int row_begin, row_count;
};
constexpr int kHeaders = 8;
constexpr int kBarrierBytes = 512;

// A unit's two halves of 16 weight rows each: the SwiGLU form's gate and up rows of one
// 16-feature slice, the store form's two consecutive slices (two halves give a consumer lane two
// independent MMA chains and let one x fragment feed twice the weights).
template <WeightKind F, bool kSwiglu, int TTMAX>
struct StreamLayout {
  static constexpr int NW = 2;
  static constexpr int kHeaderBytes = kHeaders * int(sizeof(UnitHeader<TTMAX>));
  static constexpr int kElems = WeightFmt<F>::kElems;  // per 16-byte chunk
  static constexpr int kStageElems = kConsumerWarps * 4 * kElems;
  // A stage's 16 rows of 512 bytes: the even rows, 64 bytes, then the odd rows, so that rows g
  // and g + 1 of a quarter-warp's 16-byte loads fall on different banks without padding every
  // row (which cost a stage of the ring at two weights).
  static constexpr int kOddRows = 8 * kStageRowBytes + 64;
  __host__ __device__ static constexpr int row_offset(int row) { return (row & 1) * kOddRows + (row >> 1) * kStageRowBytes; }
  static constexpr int kRowBytes = kOddRows + 8 * kStageRowBytes;
  // Scale bytes per row and stage (nvfp4: one E4M3 per 16 elements; mxfp8: one UE8M0 per 32),
  // and their pitch (80: the 2-byte reads of 8 rows hit 8 different banks).
  static constexpr int kScaleBytes =
      F == WeightKind::kNvfp4 ? kStageElems / 16 : F == WeightKind::kMxfp8 ? kStageElems / 32 : 0;
  static constexpr int kScalePitch = F == WeightKind::kNvfp4 ? 80 : F == WeightKind::kMxfp8 ? 16 : 0;
  static constexpr int kWeightBytes = kRowBytes + kUnitRows * kScalePitch;
  static constexpr int kStageBytes = NW * kWeightBytes;
  static constexpr int kSlots = NW * TTMAX * 4;  // accumulators per lane: halves x token tiles x 4
  static constexpr int kRedBytes = kConsumerWarps * kSlots * 32 * 4;
  static constexpr int kStages = (StreamForm<TTMAX>::kSmemBudget - kRedBytes - kBarrierBytes - kHeaderBytes) / kStageBytes;
  static constexpr int kSmemBytes = kBarrierBytes + kHeaderBytes + kRedBytes + kStages * kStageBytes;
  static_assert(kStages >= 3 && (2 * kStages + 2 * kHeaders + 2) * 8 <= kBarrierBytes);
};

template <WeightKind F>
__host__ __device__ constexpr int64_t data_bytes(int64_t elems) {
  return F == WeightKind::kNvfp4 ? elems / 2 : F == WeightKind::kBF16 ? 2 * elems : elems;
}

// One work unit as the producer looks it up (the consumers get a UnitHeader of it).
struct UnitHalf {
  int n0;       // first output feature of the half (in its segment)
  int n_limit;  // features of the weight (a half at or past it is empty)
  uint16_t* out;
  int64_t out_stride;
  WeightView w;
};
struct StreamUnit {
  LinearItem item;
  UnitHalf half[2];
};

__device__ __forceinline__ LinearItem load_item_cg(const LinearItem* p) {
  const int4 v = __ldcg(reinterpret_cast<const int4*>(p));
  return LinearItem{v.x, v.y, v.z, v.w};
}

// The token chunks of kTokens rows an item of a.item_rows rows is cut into.
__host__ __device__ inline int stream_chunks(const LinearArgs& a, int tokens) {
  return (a.item_rows + tokens - 1) / tokens;
}

// Unit u: chunk u % chunked of the items' token chunks (items fastest: the row tiles of one slice
// run side by side) and output pair u / chunked (SwiGLU: a slice of gate and up; store: slices
// 2 pair and 2 pair + 1, each in its own segment of a multi-weight launch). A chunk past its
// item's rows is empty (row_count <= 0).
template <bool kSwiglu, int kTokens>
__device__ __forceinline__ StreamUnit stream_unit(const LinearArgs& a, int u, int chunked) {
  StreamUnit s;
  const int chunks = stream_chunks(a, kTokens);
  const int index = (u % chunked) / chunks, chunk = (u % chunked) % chunks;
  const int pair = u / chunked;
  if (a.items != nullptr) {
    s.item = load_item_cg(a.items + index);
    if (a.streamed_items_up_to > 0 && s.item.row_count > a.streamed_items_up_to) s.item.row_count = 0;  // the wgmma kernel's
  } else {
    s.item.expert = 0;
    s.item.row_begin = index * a.item_rows;
    s.item.row_count = min(a.item_rows, a.rows - s.item.row_begin);
    s.item.pad = 0;
  }
  s.item.row_begin += chunk * kTokens;
  s.item.row_count = min(kTokens, s.item.row_count - chunk * kTokens);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    UnitHalf& h = s.half[j];
    int slice = kSwiglu ? pair : 2 * pair + j;
    h.w = weight_of(a, kSwiglu ? j : 0, s.item.expert);
    h.n_limit = a.n;
    h.out = a.out;
    h.out_stride = a.out_stride;
    if (a.num_segments > 0) {
      const int g = segment_of(a, slice);
      slice -= a.seg[g].slice_begin;
      h.n_limit = a.seg[g].n;
      h.out = a.seg[g].out;
      h.out_stride = a.seg[g].out_stride;
      h.w = a.seg[g].w;
    }
    h.n0 = slice * kUnitRows;
  }
  return s;
}

// Work units per item: output pairs.
inline int stream_pairs(const LinearArgs& a, bool swiglu) {
  const int slices = linear_slices(a);
  return swiglu ? slices : (slices + 1) / 2;
}

// Item lists are read through L2 (ld.global.cg): before its wait the producer may read a list that
// a kernel two launches back wrote (LinearArgs::schedule_ready), which an L1 line of an older read
// must not hide.
__device__ __forceinline__ int stream_items(const LinearArgs& a) {
  return a.items != nullptr ? __ldcg(a.num_items) : (a.rows + a.item_rows - 1) / a.item_rows;
}

// Whether the unit schedule is complete before the kernel before this one ends: dense launches
// read no item list and no x row gather; LinearArgs::schedule_ready says so of lists written earlier.
__device__ __forceinline__ bool schedule_ready(const LinearArgs& a) {
  return a.schedule_ready || (a.items == nullptr && a.x_rows == nullptr);
}

// src_row through L2, as the item lists (stream_items).
__device__ __forceinline__ int64_t src_row_cg(const LinearArgs& a, int r) {
  return a.x_rows != nullptr ? __ldcg(a.x_rows + r) : r;
}

// 16 bytes from src + kOff to shared address dst + kOff, both offsets immediate.
template <int kOff>
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;\n" ::"r"(dst), "l"(src), "n"(kOff) : "memory");
}

// Column c (16 bytes at 64 c) of a lane's row piece, for every c: one cp.async each with both
// offsets immediate, so that ptxas keeps one address register pair for them all.
template <int... C>
__device__ __forceinline__ void copy_columns(uint32_t dst, const uint8_t* src, std::integer_sequence<int, C...>) {
  (cp_async16_at<64 * C>(dst, src), ...);
}

// The same for the columns whose piece lies below `limit` pieces (4 c < limit): a K tail.
template <int... C>
__device__ __forceinline__ void copy_columns_below(uint32_t dst, const uint8_t* src, int limit,
                                                   std::integer_sequence<int, C...>) {
  ((4 * C < limit ? cp_async16_at<64 * C>(dst, src) : void()), ...);
}

// The CTA's shared memory: barriers, unit headers, the reduction buffer, the stage ring.
template <int TTMAX>
struct StreamSmem {
  uint64_t* full;       // [stages]: the stage's copies have landed (producer lanes)
  uint64_t* empty;      // [stages]: every consumer warp has the stage in registers
  uint64_t* hdr_full;   // [kHeaders]: the header is written (producer lanes)
  uint64_t* hdr_empty;  // [kHeaders]: the unit's outputs are stored (consumer lanes)
  uint64_t* red_full;   // every consumer lane's partial sums of a unit are in red
  uint64_t* red_empty;  // every consumer lane has finished reading red
  UnitHeader<TTMAX>* hdr;
  float* red;
  uint8_t* stages;
};

// The producer warp: every unit's weight rows and scale rows, stage by stage, into the ring.
//
// The producer must issue a stage faster than eight consumer warps expand it, while it competes
// with them for its scheduler's issue slots, so its loop is a fixed pattern of copies with
// immediate offsets: lane (r, p) owns 16 bytes at 16 p of every 64-byte column of rows r and
// r + 8 (r = lane / 4), so one cp.async instruction moves 64 bytes of each of 8 rows (whole
// 32-byte sectors) and a weight's 16 x 512-byte stage is 16 instructions whose addresses differ
// by constants. (One instruction per row with its address computed per row cost ~370
// instructions a stage, and the consumers waited for the producer.) The next unit's item and
// weights are looked up while the current unit's stages are issued; each unit's header goes to
// the consumers through a ring of its own.
template <WeightKind F, bool kSwiglu, int TTMAX>
__device__ __forceinline__ void produce(const LinearArgs& a, int chunked, int units, const StreamSmem<TTMAX>& sm) {
  using L = StreamLayout<F, kSwiglu, TTMAX>;
  constexpr int NW = L::NW, S = L::kStages;
  constexpr int kColumns = kStageRowBytes / 64;                 // 64-byte columns of a stage row
  constexpr int kScaleChunks = L::kScaleBytes / 16;             // 16-byte words of a scale row
  const int lane = threadIdx.x & 31, r = lane >> 2, p = lane & 3;
  int stage = 0;
  uint32_t phase = 0;
  StreamUnit next;
  constexpr int kTokens = StreamForm<TTMAX>::kTokens;
  if (int(blockIdx.x) < units) next = stream_unit<kSwiglu, kTokens>(a, blockIdx.x, chunked);
  for (int u = blockIdx.x, m = 0; u < units; u += gridDim.x, ++m) {
    const StreamUnit un = next;
    if (u + int(gridDim.x) < units) next = stream_unit<kSwiglu, kTokens>(a, u + gridDim.x, chunked);
    {
      const int slot = m % kHeaders;
      mbar_wait(&sm.hdr_empty[slot], ((m / kHeaders) & 1) ^ 1u);
      UnitHeader<TTMAX>& h = sm.hdr[slot];
      // An empty unit's header carries only its row count (no x rows: nothing reads them).
      if (un.item.row_count > 0) {
#pragma unroll
        for (int t = lane; t < StreamForm<TTMAX>::kTokens; t += 32)
          h.xoff[t] = src_row_cg(a, un.item.row_begin + (t < un.item.row_count ? t : 0)) * a.x_stride;
      }
      if (lane == 0) {
        h.row_begin = un.item.row_begin;
        h.row_count = un.item.row_count;
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          h.half[j].scale = OutScale::of(un.half[j].w);
          if (kSwiglu && j == 1) continue;  // the SwiGLU form stores through half 0 only
          h.half[j].out = un.half[j].out;
          h.half[j].out_stride = un.half[j].out_stride;
          h.half[j].n0 = un.half[j].n0;
          h.half[j].n_limit = un.half[j].n_limit;
        }
      }
      mbar_arrive(&sm.hdr_full[slot]);  // every lane, after its own stores
    }
    if (un.item.row_count <= 0) continue;  // an empty chunk: no stages
    // Row r's pieces of each half (and of its scales); row r + 8's lie 8 strides further.
    bool has[NW][2];
    const uint8_t* src[NW];
    const uint8_t* ssrc[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const UnitHalf& uh = un.half[j];
      const UnitHalf& span = un.half[kSwiglu ? 0 : j];  // the SwiGLU halves share their slice
      const int rows = min(kUnitRows, span.n_limit - span.n0);
      has[j][0] = r < rows;
      has[j][1] = r + 8 < rows;
      const int64_t row = span.n0 + r;
      src[j] = uh.w.data + row * uh.w.row_bytes + 16 * p;
      ssrc[j] = kScaleChunks > 0 ? uh.w.scale + row * uh.w.scale_stride + 16 * p : nullptr;
    }
#pragma unroll 1
    for (int k0 = 0; k0 < a.k; k0 += L::kStageElems) {
      const int elems = min(L::kStageElems, a.k - k0);
      // Pieces (16-byte words) of a row in this stage: all of them except in a K tail, whose scale
      // bytes round up to a word (inside the row: its stride is a multiple of 16, streamed_linear_ok).
      const int data_chunks = int(data_bytes<F>(elems) / 16);
      const int scale_chunks = kScaleChunks == 0 ? 0 : (elems * L::kScaleBytes / L::kStageElems + 15) / 16;
      const bool whole = elems == L::kStageElems;
      const int64_t data_off = data_bytes<F>(k0);
      const int64_t scale_off = kScaleChunks > 0 ? int64_t(k0) * L::kScaleBytes / L::kStageElems : 0;
      mbar_wait(&sm.empty[stage], phase ^ 1u);
      uint8_t* dst = sm.stages + stage * L::kStageBytes;
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!has[j][h]) continue;
          const uint32_t d = smem_u32(dst + j * L::kWeightBytes + L::row_offset(r + 8 * h) + 16 * p);
          const uint8_t* s = src[j] + data_off + (h == 0 ? 0 : 8 * un.half[j].w.row_bytes);
          if (whole)
            copy_columns(d, s, std::make_integer_sequence<int, kColumns>());
          else
            copy_columns_below(d, s, data_chunks - p, std::make_integer_sequence<int, kColumns>());
          if constexpr (kScaleChunks > 0)
            if (p < scale_chunks)
              cp_async16(dst + j * L::kWeightBytes + L::kRowBytes + (r + 8 * h) * L::kScalePitch + 16 * p,
                         ssrc[j] + scale_off + (h == 0 ? 0 : 8 * un.half[j].w.scale_stride));
        }
      mbar_arrive_on_copies(&sm.full[stage]);
      if (++stage == S) {
        stage = 0;
        phase ^= 1u;
      }
    }
  }
}

// Sub s (8 elements a lane) of the x rows of the stage at k0 into x[s], from the token rows'
// pointers xrow (already at the lane's chunk). kTail: the last stage, shorter than a stage: a
// chunk past K loads x's first elements, a valid address, zeroed after.
template <int SUBS, int TT, bool kTail>
__device__ __forceinline__ void load_sub_x(uint4 (&x)[SUBS][TT], const uint16_t* const (&xrow)[TT], const LinearArgs& a,
                                           int k0, int kl, int s) {
  const bool active = !kTail || k0 + kl < a.k;
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    if constexpr (kTail) {
      const uint4 v = *reinterpret_cast<const uint4*>(active ? xrow[tt] + k0 + 8 * s : a.x);
      x[s][tt] = active ? v : make_uint4(0, 0, 0, 0);
    } else {
      x[s][tt] = *reinterpret_cast<const uint4*>(xrow[tt] + k0 + 8 * s);
    }
  }
}

template <int SUBS, int TT, bool kTail>
__device__ __forceinline__ void load_stage_x(uint4 (&x)[SUBS][TT], const uint16_t* const (&xrow)[TT], const LinearArgs& a,
                                             int k0, int kl) {
#pragma unroll
  for (int s = 0; s < SUBS; ++s) load_sub_x<SUBS, TT, kTail>(x, xrow, a, k0, kl, s);
}

// Unit m's epilogue: the fixed-order sum of the consumer warps' partials (batch invariance relies
// on it), one output element per consumer thread and half (16 features x 16 tokens), then the
// unit's header and red are handed back.
template <WeightKind F, bool kSwiglu, int TTMAX>
__device__ __forceinline__ void finish_unit(const LinearArgs& a, int m, const StreamSmem<TTMAX>& sm) {
  using L = StreamLayout<F, kSwiglu, TTMAX>;
  constexpr int NW = L::NW;
  mbar_wait(sm.red_full, m & 1);
  const int slot = m % kHeaders;
  const UnitHeader<TTMAX>& hdr = sm.hdr[slot];
  // Output index e (of TTMAX x 4 accumulators x 32 lanes) per consumer thread and pass.
#pragma unroll
  for (int e = threadIdx.x; e < TTMAX * 4 * 32; e += kConsumerWarps * 32) {
    const int ln = e & 31, c = (e >> 5) & 3, tt = e >> 7;
    const int feature = (ln >> 2) + (c >= 2 ? 8 : 0);
    const int token = 8 * tt + 2 * (ln & 3) + (c & 1);
    if (token >= hdr.row_count) continue;
    float v[NW];
    OutScale scale[NW];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const int slot_j = (j * TTMAX + tt) * 4 + c;
      float sum = sm.red[slot_j * 32 + ln];
#pragma unroll
      for (int wi = 1; wi < kConsumerWarps; ++wi) sum += sm.red[(wi * L::kSlots + slot_j) * 32 + ln];
      v[j] = sum;
      scale[j] = hdr.half[j].scale;
    }
    const int64_t row = hdr.row_begin + token;
    // SwiGLU: gate and up combine into half 0's output; a store: each half its own.
#pragma unroll
    for (int j = 0; j < (kSwiglu ? 1 : NW); ++j) {
      const HalfHeader& h = hdr.half[j];
      if (h.n0 + feature < h.n_limit)
        h.out[row * h.out_stride + h.n0 + feature] = f32_to_bf16_bits(epilogue_value<kSwiglu>(a, scale + j, v + j));
    }
  }
  // Every lane, after its own reads (these barriers are once a unit; the stage ring's, once a
  // stage, take one arrival per warp after __syncwarp).
  mbar_arrive(sm.red_empty);
  mbar_arrive(&sm.hdr_empty[slot]);
}

// One consumer warp's share of a unit: its 64 bytes of every weight row of each stage, expanded
// and multiplied into the accumulators, which end in `red` for the unit's reduction.
//
// The MMAs take the weights as their A operand (16 rows: the unit's features g and g + 8) and the
// x rows as B (8 columns: tokens), so an item of up to 8 rows needs one MMA per 16 K and weight
// (TT = 1 token tile) and one x row per lane, half of what the x-as-A layout needs. A token the
// item lacks reads the item's first row (a valid address; its column of the product is never
// stored), so only a K tail past the weight's end zeroes x.
//
// m: the unit's number in this CTA; after_first() runs once after the first stage (the previous
// unit's epilogue, which then waits on the other warps less). The partial sums go to `red` once
// the previous unit's epilogue has read it, and arrive on red_full.
template <WeightKind F, bool kSwiglu, int TTMAX, int TT, class AfterFirst>
__device__ __forceinline__ void consume_unit(const LinearArgs& a, const UnitHeader<TTMAX>& hdr, int m,
                                             const StreamSmem<TTMAX>& sm, int& stage, uint32_t& phase,
                                             AfterFirst&& after_first) {
  using L = StreamLayout<F, kSwiglu, TTMAX>;
  constexpr int NW = L::NW, E = L::kElems, KC = 4 * E, SUBS = E / 8, S = L::kStages;
  // x before the stage's full-barrier wait where registers allow, so that its loads (L1 / L2)
  // overlap the wait: in the narrow form two CTAs per SM leave 96 registers, which two token
  // tiles of the nvfp4 SwiGLU form (two weights, 4 x 2 x 16 bytes of x per stage) would exceed by
  // spilling; there, and in the wide form's four tiles, each sub's x is loaded just before its
  // MMAs.
  constexpr bool kXEarly = TT <= 2 && !(F == WeightKind::kNvfp4 && kSwiglu && TT == 2);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int kl = warp * KC + q * E;  // the lane's chunk inside a stage

  const uint16_t* xrow[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) xrow[tt] = a.x + hdr.xoff[g + 8 * tt] + kl;
  float acc[NW][TT][4];
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][tt][c] = 0.0f;

  // One stage (kTail: the last, shorter one).
  auto step = [&](int k0, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const bool active = !kTail || k0 + kl < a.k;
    uint4 xa[SUBS][TT];
    if constexpr (kXEarly || kTail) load_stage_x<SUBS, TT, kTail>(xa, xrow, a, k0, kl);
    mbar_wait(&sm.full[stage], phase);
    uint4 raw[NW][2];
    FastScale sc[NW][2];
    const uint8_t* buf = sm.stages + stage * L::kStageBytes;
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = h * 8 + g;
        if (active) {
          raw[j][h] = *reinterpret_cast<const uint4*>(buf + j * L::kWeightBytes + L::row_offset(row) + warp * 64 + q * 16);
          [[maybe_unused]] const uint8_t* srow = buf + j * L::kWeightBytes + L::kRowBytes + row * L::kScalePitch;
          if constexpr (F == WeightKind::kNvfp4)
            sc[j][h] = fast_scale_of<F>(*reinterpret_cast<const uint16_t*>(srow + kl / 16));
          else if constexpr (F == WeightKind::kMxfp8)
            sc[j][h] = fast_scale_of<F>(srow[kl / 32]);
          else
            sc[j][h] = FastScale();
        } else {
          raw[j][h] = make_uint4(0, 0, 0, 0);
          sc[j][h] = FastScale();
        }
      }
    // The stage is in registers: hand it back before the arithmetic.
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[stage]);
    if (++stage == S) {
      stage = 0;
      phase ^= 1u;
    }

    auto compute = [&](auto exact) {
      constexpr bool kExact = decltype(exact)::value;
#pragma unroll
      for (int s = 0; s < SUBS; ++s) {
        // Otherwise each sub's x just before its MMAs: fewer registers live.
        if constexpr (!kXEarly && !kTail) load_sub_x<SUBS, TT, false>(xa, xrow, a, k0, kl, s);
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          const uint4 w0 = expand_sub<F, kExact>(raw[j][0], s, sc[j][0]);
          const uint4 w1 = expand_sub<F, kExact>(raw[j][1], s, sc[j][1]);
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) mma_sub(acc[j][tt], w0, w1, xa[s][tt]);
        }
      }
    };
    if constexpr (F == WeightKind::kMxfp8) {
      uint32_t top = 0;
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) top = max(top, sc[j][h].pair[0]);
      if (__any_sync(0xFFFFFFFFu, top > mx_fast_pair(kMxfp8FastMaxExp))) {
        compute(std::true_type());
        return;
      }
    }
    compute(std::false_type());
  };
  int k0 = 0;
  for (; k0 + L::kStageElems <= a.k; k0 += L::kStageElems) {
    step(k0, std::false_type());
    if (k0 == 0) after_first();
  }
  if (k0 < a.k) {
    step(k0, std::true_type());
    if (k0 == 0) after_first();
  }

  mbar_wait(sm.red_empty, (m & 1) ^ 1u);  // the previous unit's epilogue has read red
  // acc[j][tt][c]: feature g (c < 2) or g + 8, token 8 tt + 2 q + (c & 1).
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int tt = 0; tt < TT; ++tt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float v = acc[j][tt][c];
        if constexpr (F == WeightKind::kNvfp4) v *= float(1 << kNvfp4AccShift);  // decode_sub_fast's 2^-8
        sm.red[(warp * L::kSlots + (j * TTMAX + tt) * 4 + c) * 32 + lane] = v;
      }
  mbar_arrive(sm.red_full);  // every lane, after its own stores
}

template <WeightKind F, bool kSwiglu, int TTMAX>
__global__ void __launch_bounds__(kThreads, StreamForm<TTMAX>::kCtasPerSm)
    streamed_linear_kernel(const LinearArgs a, int pairs) {
  // No kernel_prologue() here: the producer waits for the kernel before only where the unit
  // schedule depends on it (below); the consumers wait before they read x.
  using L = StreamLayout<F, kSwiglu, TTMAX>;
  constexpr int S = L::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  StreamSmem<TTMAX> sm;
  sm.full = reinterpret_cast<uint64_t*>(smem);
  sm.empty = sm.full + S;
  sm.hdr_full = sm.empty + S;
  sm.hdr_empty = sm.hdr_full + kHeaders;
  sm.red_full = sm.hdr_empty + kHeaders;
  sm.red_empty = sm.red_full + 1;
  sm.hdr = reinterpret_cast<UnitHeader<TTMAX>*>(smem + kBarrierBytes);
  sm.red = reinterpret_cast<float*>(smem + kBarrierBytes + L::kHeaderBytes);
  sm.stages = smem + kBarrierBytes + L::kHeaderBytes + L::kRedBytes;

  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&sm.full[s], 32);  // the producer lanes
      mbar_init(&sm.empty[s], kConsumerWarps);
    }
    for (int h = 0; h < kHeaders; ++h) {
      mbar_init(&sm.hdr_full[h], 32);
      mbar_init(&sm.hdr_empty[h], kConsumerWarps * 32);
    }
    mbar_init(sm.red_full, kConsumerWarps * 32);
    mbar_init(sm.red_empty, kConsumerWarps * 32);
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    // The weights stream in before the kernel before this one has finished when the producer
    // needs nothing it writes (weights are never written by kernels, launch.cuh): the first
    // stages of the ring fill during its tail instead of after it.
    if (!schedule_ready(a)) grid_dependency_wait();
    const int chunked = stream_items(a) * stream_chunks(a, StreamForm<TTMAX>::kTokens);
    produce<F, kSwiglu, TTMAX>(a, chunked, chunked * pairs, sm);
    return;
  }
  kernel_prologue();
  const int chunked = stream_items(a) * stream_chunks(a, StreamForm<TTMAX>::kTokens);
  const int units = chunked * pairs;

  // Consumers. Unit m's epilogue runs inside unit m + 1 (consume_unit; the last unit's after the
  // loop), so that a warp does not wait for the other warps' partial sums at the end of every unit.
  int stage = 0;
  uint32_t phase = 0;
  int m = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x, ++m) {
    const int slot = m % kHeaders;
    mbar_wait(&sm.hdr_full[slot], (m / kHeaders) & 1);
    const UnitHeader<TTMAX>& hdr = sm.hdr[slot];
    auto previous = [&] {
      if (m > 0) finish_unit<F, kSwiglu, TTMAX>(a, m - 1, sm);
    };
    // The token tiles a unit takes, a warp-uniform choice: narrow, one for items of up to 8 rows
    // (most routed experts' at decode, dense layers up to batch 8), else two; wide, two for up
    // to 16 rows, else four. An empty chunk (an expert's rows end in an earlier one) has no
    // stages, but keeps its place in the reduction buffer's order.
    if (hdr.row_count <= 0) {
      previous();
      mbar_wait(sm.red_empty, (m & 1) ^ 1u);
      mbar_arrive(sm.red_full);
    } else if constexpr (TTMAX <= 2) {
      if (hdr.row_count > 8)
        consume_unit<F, kSwiglu, TTMAX, 2>(a, hdr, m, sm, stage, phase, previous);
      else
        consume_unit<F, kSwiglu, TTMAX, 1>(a, hdr, m, sm, stage, phase, previous);
    } else {
      if (hdr.row_count > 16)
        consume_unit<F, kSwiglu, TTMAX, 4>(a, hdr, m, sm, stage, phase, previous);
      else
        consume_unit<F, kSwiglu, TTMAX, 2>(a, hdr, m, sm, stage, phase, previous);
    }
  }
  if (m > 0) finish_unit<F, kSwiglu, TTMAX>(a, m - 1, sm);
}

template <WeightKind F, bool kSwiglu, int TTMAX>
cudaError_t launch_form(const LinearArgs& a, int max_items, cudaStream_t stream) {
  using L = StreamLayout<F, kSwiglu, TTMAX>;
  const int pairs = stream_pairs(a, kSwiglu);
  int device = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  const int64_t units = int64_t(max_items) * stream_chunks(a, StreamForm<TTMAX>::kTokens) * pairs;
  const int grid = int(std::min<int64_t>(units, int64_t(sms) * StreamForm<TTMAX>::kCtasPerSm));
  if (grid <= 0) return cudaSuccess;
  launch_kernel(streamed_linear_kernel<F, kSwiglu, TTMAX>, grid, kThreads, L::kSmemBytes, stream, a, pairs);
  return cudaGetLastError();
}

// Items of 16 rows take the narrow form, of 32 or 64 the wide one.
template <WeightKind F, bool kSwiglu>
cudaError_t launch_kind(const LinearArgs& a, int max_items, cudaStream_t stream) {
  return a.item_rows <= 16 ? launch_form<F, kSwiglu, 2>(a, max_items, stream)
                           : launch_form<F, kSwiglu, 4>(a, max_items, stream);
}

template <bool kSwiglu>
cudaError_t launch_epilogue(const LinearArgs& a, int max_items, cudaStream_t stream) {
  return dispatch_mma_kind(a.w[0].kind,
                           [&](auto kind) { return launch_kind<decltype(kind)::value, kSwiglu>(a, max_items, stream); });
}

template <WeightKind F, bool kSwiglu, int TTMAX>
cudaError_t set_smem_limit_of() {
  return cudaFuncSetAttribute(streamed_linear_kernel<F, kSwiglu, TTMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              StreamLayout<F, kSwiglu, TTMAX>::kSmemBytes);
}

template <WeightKind F>
cudaError_t set_smem_limit() {
  cudaError_t e;
  if ((e = set_smem_limit_of<F, false, 2>()) != cudaSuccess) return e;
  if ((e = set_smem_limit_of<F, true, 2>()) != cudaSuccess) return e;
  if ((e = set_smem_limit_of<F, false, 4>()) != cudaSuccess) return e;
  return set_smem_limit_of<F, true, 4>();
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
  if ((a.item_rows != 16 && a.item_rows != 32 && a.item_rows != 64) || a.x_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0)
    return false;
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
