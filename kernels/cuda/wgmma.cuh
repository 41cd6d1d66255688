// Hopper warpgroup MMAs (wgmma): the MSA kernels' E4M3 x E4M3 products (the indexer over fp8/nvfp4
// caches, attention over the NVFP4 KV cache), on E4M3 or fp16 operands, and the prefill GEMM's bf16
// products (backend/linear_wgmma.cu). A warpgroup is 128 threads. mma.sync with E4M3 inputs is no FP8
// instruction on sm_90 (ptxas converts the operands for fp16 HMMA, which sums at fp32 accuracy:
// msa_bench --fp8-mma-probe); wgmma is, and its sums are far from fp32 (Hopper's FP8 tensor cores
// truncate): the probe measured errors up to 1.0e-3 of the sum of |products| over k = 128 (fp16
// operands: 5e-7), enough to move E4M3 roundings of P downstream. wgmma_f16 takes E4M3 values
// exactly as fp16 and sums accurately.
//
// The MSA kernels' shared-memory operands are K-major without swizzle: core matrices of 8 rows x 16
// bytes (128 contiguous bytes), described by a start address, the byte offset between core
// matrices along K (LBO) and between 8-row groups (SBO). An A operand from registers is the
// mma.sync m16n8k32 (E4M3) or m16n8k16 (16-bit) A fragment of the warp's 16 rows (warp w: rows
// 16w..16w+15 of the m64 tile). D of m64nN: N / 2 floats per thread, for each 8 columns j: (row g,
// columns 8j + 2t, +1), (row g + 8, the same).
#pragma once
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace m3::cuda::detail {

// A K-major operand of up to 64 rows x 128 bytes (the indexer's query rows): the 8 core matrices of
// a row group side by side along K (kQCoreK apart), row groups kQCoreN apart. Byte offset of
// (row n, byte p):
inline constexpr int kQCoreK = 128, kQCoreN = 8 * kQCoreK;
__device__ __forceinline__ int wgmma_q_offset(int n, int p) {
  return (n >> 3) * kQCoreN + (p >> 4) * kQCoreK + (n & 7) * 16 + (p & 15);
}

// A K-major fp16 operand of up to 64 rows x 128 elements (wgmma_f16's B): core matrices of 8 rows
// x 8 elements side by side along K (kF16CoreK apart), row groups kF16CoreN apart; k16 step ks
// starts 2 * ks * kF16CoreK bytes on. Byte offset of (row n, element p):
inline constexpr int kF16CoreK = 128, kF16CoreN = 16 * kF16CoreK;
__device__ __forceinline__ int wgmma_f16_offset(int n, int p) {
  return (n >> 3) * kF16CoreN + (p >> 3) * kF16CoreK + (n & 7) * 16 + (p & 7) * 2;
}

// Shared-memory matrix descriptor (no swizzle): start address, leading byte offset (between core
// matrices along K), stride byte offset (between 8-row groups), each in 16-byte units.
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, int lbo, int sbo) {
  return uint64_t((smem_u32(smem) & 0x3ffff) >> 4) | uint64_t(lbo >> 4) << 16 | uint64_t(sbo >> 4) << 32;
}

// D (+)= A * B for the warpgroup: m64nNk32, E4M3 inputs, fp32 accumulators; A from registers (this
// warp's 16 rows: the mma.sync m16n8k32 A fragment), B from shared memory. D: N / 2 floats, for
// each 8 columns j: (row g, cols 8j + 2t, +1), (row g + 8, the same columns).
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float* d, const uint32_t (&a)[4], uint64_t b, bool accumulate);

// D (+)= A * B for the warpgroup: m64nNk16, fp16 inputs, fp32 accumulators; A from registers (this
// warp's 16 rows: the mma.sync m16n8k16 A fragment, (row g, k 2t, 2t+1), (row g + 8, the same),
// (row g, k 2t+8, 2t+9), (row g + 8, the same)), B K-major in shared memory. D: as wgmma_e4m3's.
// Unlike the E4M3 MMAs, whose sums are off by up to ~1e-3 of the sum of |products| on Hopper, fp16
// products sum at fp32 accuracy: the attention scores that P8 is rounded from (sparse_rows.cu,
// sparse_groups.cu) come from these.
template <int N>
__device__ __forceinline__ void wgmma_f16(float* d, const uint32_t (&a)[4], uint64_t b, bool accumulate);

// D (+)= A * B for the warpgroup: m64nNk16, bf16 inputs, fp32 accumulators; A from registers (as
// wgmma_f16's), B K-major in shared memory (any layout a descriptor names: the prefill GEMM's x
// tiles are 128-byte swizzled). D: as wgmma_e4m3's.
template <int N>
__device__ __forceinline__ void wgmma_bf16(float* d, const uint32_t (&a)[4], uint64_t b, bool accumulate);

// One specialisation of FN<N> (register A, shared-memory B): TYPES the shape's k and the operand
// types, IMM the immediates after scale-d, ARGS the operand list of N (M3_WGMMA_ARGS_N) and DREGS
// the index of its scale-d operand.
#define M3_WGMMA_RS(FN, N, TYPES, IMM, DREGS, ARGS)                                                  \
  template <>                                                                                        \
  __device__ __forceinline__ void FN<N>(float* d, const uint32_t (&a)[4], uint64_t b, bool acc) {     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #DREGS ", 0;\n"                                \
                 "wgmma.mma_async.sync.aligned.m64n" #N TYPES " " ARGS ", p, " IMM ";\n}\n"           \
                 : M3_WGMMA_OUT_##N(d)                                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(acc)));               \
  }
#define M3_WGMMA_OUT_8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define M3_WGMMA_OUT_16(d) M3_WGMMA_OUT_8(d), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define M3_WGMMA_OUT_32(d) \
  M3_WGMMA_OUT_16(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define M3_WGMMA_OUT_64(d)                                                                                      \
  M3_WGMMA_OUT_32(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),     \
      "+f"(d[31])
#define M3_WGMMA_OUT_128(d) \
  M3_WGMMA_OUT_64(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
      "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
      "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
      "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
      "+f"(d[62]), "+f"(d[63])
#define M3_WGMMA_ARGS_8 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, %8"
#define M3_WGMMA_ARGS_16 "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12"
#define M3_WGMMA_ARGS_32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20"
#define M3_WGMMA_ARGS_64                                                                                   \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31}, {%32,%33,%34,%35}, %36"
#define M3_WGMMA_ARGS_128                                                                                  \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68"
#define M3_WGMMA_OUT_192(d) \
  M3_WGMMA_OUT_128(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), \
      "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), \
      "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), \
      "+f"(d[95])
#define M3_WGMMA_OUT_256(d) \
  M3_WGMMA_OUT_192(d), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
      "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), \
      "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
      "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define M3_WGMMA_ARGS_192 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, {%96,%97,%98,%99}, %100"
#define M3_WGMMA_ARGS_256 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104," \
  "%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125," \
  "%126,%127}, {%128,%129,%130,%131}, %132"
M3_WGMMA_RS(wgmma_e4m3, 8, "k32.f32.e4m3.e4m3", "1, 1", 9, M3_WGMMA_ARGS_8)
M3_WGMMA_RS(wgmma_e4m3, 16, "k32.f32.e4m3.e4m3", "1, 1", 13, M3_WGMMA_ARGS_16)
M3_WGMMA_RS(wgmma_e4m3, 32, "k32.f32.e4m3.e4m3", "1, 1", 21, M3_WGMMA_ARGS_32)
M3_WGMMA_RS(wgmma_e4m3, 64, "k32.f32.e4m3.e4m3", "1, 1", 37, M3_WGMMA_ARGS_64)
M3_WGMMA_RS(wgmma_e4m3, 128, "k32.f32.e4m3.e4m3", "1, 1", 69, M3_WGMMA_ARGS_128)
M3_WGMMA_RS(wgmma_f16, 16, "k16.f32.f16.f16", "1, 1, 0", 13, M3_WGMMA_ARGS_16)  // 0: B not transposed
M3_WGMMA_RS(wgmma_f16, 64, "k16.f32.f16.f16", "1, 1, 0", 37, M3_WGMMA_ARGS_64)
M3_WGMMA_RS(wgmma_bf16, 64, "k16.f32.bf16.bf16", "1, 1, 0", 37, M3_WGMMA_ARGS_64)
M3_WGMMA_RS(wgmma_bf16, 128, "k16.f32.bf16.bf16", "1, 1, 0", 69, M3_WGMMA_ARGS_128)
M3_WGMMA_RS(wgmma_bf16, 192, "k16.f32.bf16.bf16", "1, 1, 0", 101, M3_WGMMA_ARGS_192)
M3_WGMMA_RS(wgmma_bf16, 256, "k16.f32.bf16.bf16", "1, 1, 0", 133, M3_WGMMA_ARGS_256)
#undef M3_WGMMA_RS
#undef M3_WGMMA_ARGS_8
#undef M3_WGMMA_ARGS_16
#undef M3_WGMMA_ARGS_32
#undef M3_WGMMA_ARGS_64
#undef M3_WGMMA_ARGS_128
#undef M3_WGMMA_ARGS_192
#undef M3_WGMMA_ARGS_256
#undef M3_WGMMA_OUT_8
#undef M3_WGMMA_OUT_16
#undef M3_WGMMA_OUT_32
#undef M3_WGMMA_OUT_64
#undef M3_WGMMA_OUT_128
#undef M3_WGMMA_OUT_192
#undef M3_WGMMA_OUT_256

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs.
template <int N>
__device__ __forceinline__ void wgmma_pin(float* d) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (+)= A * B for the warpgroup, m64nNk32, E4M3 inputs, fp32 accumulators, A and B in shared memory.
// D: as wgmma_e4m3's.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_ss(float* d, uint64_t a, uint64_t b, bool accumulate);

#define M3_WGMMA_E4M3_SS(N, DREGS, ...)                                                                   \
  template <>                                                                                              \
  __device__ __forceinline__ void wgmma_e4m3_ss<N>(float* d, uint64_t a, uint64_t b, bool acc) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #DREGS ", 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " __VA_ARGS__ ";\n}\n"            \
                 : M3_WGMMA_SS_OUT_##N(d)                                                                  \
                 : "l"(a), "l"(b), "r"(int(acc)));                                                         \
  }
#define M3_WGMMA_SS_OUT_16(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
M3_WGMMA_E4M3_SS(16, 10, "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1")
#undef M3_WGMMA_E4M3_SS
#undef M3_WGMMA_SS_OUT_16

// Four bf16 values (two words, element 0 in the low half of the first) to their saturating
// round-to-nearest-even E4M3 bytes (element i in byte i): the hardware conversion, the same bytes
// as formats/fp8_e4m3.h's fp8_e4m3_encode (NaN stays NaN, +-inf saturates to +-448).
__device__ __forceinline__ uint32_t bf16x4_to_e4m3x4(uint2 raw) {
  const float f0 = __uint_as_float(raw.x << 16), f1 = __uint_as_float(raw.x & 0xffff0000u);
  const float f2 = __uint_as_float(raw.y << 16), f3 = __uint_as_float(raw.y & 0xffff0000u);
  return f32x2_to_e4m3x2(f0, f1) | f32x2_to_e4m3x2(f2, f3) << 16;
}

// Four consecutive activations (bf16 bits or E4M3 bytes) at element i cast to E4M3 (saturating,
// no scale): the queries that fp8 and nvfp4 caches meet (ops/attention.h).
__device__ __forceinline__ uint32_t load_act4_e4m3(const void* src, ActKind kind, int64_t i) {
  if (kind == ActKind::kE4M3) return *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(src) + i);
  return bf16x4_to_e4m3x4(*reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(src) + i));
}

// Two activations (bf16 bits or E4M3 bytes) at element i as E4M3 values in an fp16 pair (element i
// in the low half).
__device__ __forceinline__ uint32_t load_act2_e4m3_as_f16x2(const void* src, ActKind kind, int64_t i) {
  if (kind == ActKind::kE4M3)
    return e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(src) + i));
  const uint32_t raw = *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(src) + i);
  return f32x2_to_e4m3_as_f16x2(__uint_as_float(raw << 16), __uint_as_float(raw & 0xffff0000u));
}

// N pairs as load_act2_e4m3_as_f16x2 (pair k at element index(k), zero where !valid(k)) with the
// kind's branch taken once, so that the N loads are in flight together: behind a branch each, ptxas
// issued them a few at a time, and the walks' first tiles waited on the chain (ncu).
template <int N, class Index, class Valid>
__device__ __forceinline__ void load_act2_e4m3_as_f16x2_batch(const void* src, ActKind kind, Index index, Valid valid,
                                                              uint32_t (&out)[N]) {
  if (kind == ActKind::kE4M3) {
#pragma unroll
    for (int k = 0; k < N; ++k)
      out[k] = valid(k) ? *reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(src) + index(k)) : 0u;
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = e4m3x2_to_f16x2(out[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k)
      out[k] = valid(k) ? *reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(src) + index(k)) : 0u;
#pragma unroll
    for (int k = 0; k < N; ++k)
      out[k] = f32x2_to_e4m3_as_f16x2(__uint_as_float(out[k] << 16), __uint_as_float(out[k] & 0xffff0000u));
  }
}

// Generic-proxy stores to shared memory made visible to the tensor cores' (async proxy) reads.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// 8 nvfp4 codes (one 32-bit word, element 2i in the low nibble of byte i) to their E4M3 view:
// lo = elements 0..3, hi = elements 4..7, one byte each; t = the table entry of their scale byte.
__device__ __forceinline__ void nvfp4_word_to_e4m3(uint32_t x, uint2 t, uint32_t& lo, uint32_t& hi) {
  // Magnitudes: the table's byte (code & 7); a byte permute reads only its selector's low 16 bits.
  // Signs: bit 3 of code 2j sits at bit 7 of byte j of x << 4, that of code 2j+1 at bit 7 of byte j
  // of x.
  const uint32_t sel = x & 0x77777777u, shifted = x << 4;
  lo = __byte_perm(t.x, t.y, sel) | (__byte_perm(shifted, x, 0x5140u) & 0x80808080u);
  hi = __byte_perm(t.x, t.y, sel >> 16) | (__byte_perm(shifted, x, 0x7362u) & 0x80808080u);
}

// E4M3 key rows as MMA fragments. A k32 step s takes from thread t positions 4t..4t+3 and
// 16+4t..16+4t+3 of each of its key rows; thread t reads one contiguous run of a key row,
// elements 32t..32t+31, whose 4-element groups 2s and 2s+1 feed k-step s. The query rows are
// stored in the same order: logical byte p of a query row holds this element.
__device__ __forceinline__ int e4m3_row_element(int p) {
  const int step = p >> 5, q = p & 31;
  return 32 * ((q & 15) >> 2) + 8 * step + 4 * (q >> 4) + (q & 3);
}

// Thread t's fragments of key row `row` of a staged 64-token nvfp4 tile (64 code rows of 64
// bytes, then 64 scale rows of 8) as the E4M3 view: b[s][0] feeds positions 4t.. of k-step s,
// b[s][1] positions 16+4t... One 16-byte load: with rows side by side the 8 lanes of a
// shared-memory phase read 128 distinct bytes.
__device__ __forceinline__ void nvfp4_key_row(const uint8_t* tile, const uint2* table, int row, int t,
                                              uint32_t (&b)[4][2]) {
  const uint4 x = *reinterpret_cast<const uint4*>(tile + row * 64 + 16 * t);
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
  // Words 0, 1 share scale 2t, words 2, 3 scale 2t + 1.
  const uint16_t sc = *reinterpret_cast<const uint16_t*>(tile + 64 * 64 + row * 8 + 2 * t);
  const uint2 tab[2] = {table[sc & 0xff], table[sc >> 8]};
#pragma unroll
  for (int s = 0; s < 4; ++s) nvfp4_word_to_e4m3(w[s], tab[s >> 1], b[s][0], b[s][1]);
}

// The same key rows as fp16 MMA fragments (wgmma_f16: the scores' sums at fp32 accuracy). A k16
// step ks takes from thread t positions 2t, 2t+1 and 2t+8, 2t+9 of each key row; thread t still
// reads elements 32t..32t+31, whose 4-element group ks feeds k-step ks: positions 16ks + 2t + c
// hold element 32t + 4ks + c, positions 16ks + 2t + 8 + c element 32t + 4ks + 2 + c. The query
// rows are stored in the same order: logical fp16 p of a query row holds this element.
__device__ __forceinline__ int f16_row_element(int p) {
  const int ks = p >> 4, q = p & 15;
  return 32 * ((q & 7) >> 1) + 4 * ks + 2 * (q >> 3) + (q & 1);
}

// Thread t's fp16 fragments of key row `row` of a staged 64-token nvfp4 tile (as nvfp4_key_row):
// b[ks][0] feeds positions 2t, 2t+1 of k-step ks, b[ks][1] positions 2t+8, 2t+9. E4M3 values
// are exact in fp16.
__device__ __forceinline__ void nvfp4_key_row_f16(const uint8_t* tile, const uint2* table, int row, int t,
                                                  uint32_t (&b)[8][2]) {
  uint32_t e[4][2];
  nvfp4_key_row(tile, table, row, t, e);
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      b[2 * s + j][0] = e4m3x2_to_f16x2(e[s][j]);
      b[2 * s + j][1] = e4m3x2_to_f16x2(e[s][j] >> 16);
    }
}

}  // namespace m3::cuda::detail
