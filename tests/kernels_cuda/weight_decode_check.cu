// Exhaustive device check of the skinny kernel's register-only weight expansion: decode_sub_fast
// must equal decode_sub (the float path, exact by construction) bit for bit, after the documented
// power-of-two factor, for every fp8 byte x every UE8M0 exponent up to kMxfp8FastMaxExp (and the
// exponent must round-trip through the scale pair for all 256), and for every e2m1 nibble x every
// positive finite E4M3 group scale. Also the formats/ codecs whose device forms differ from the
// host's: the E4M3 encode over every float and decode over every byte (conversion instructions
// against the integer rule), and the KV encoder's division-free E2M1 rounding (e2m1_encode_scaled)
// against e2m1_encode over every float at scale 1, where the quotient is exact, and the backend's
// bf16 rounding (f32_to_bf16_bits: the conversion instruction) against bf16_encode over every float,
// the instruction alone over every float but NaN. Run on the GPU machine: prints the mismatch counts,
// exit 1 on any mismatch.
#include <cstdio>

#include "formats/fp8_e4m3.h"
#include "formats/nvfp4.h"
#include "kernels/cuda/backend/device_math.cuh"
#include "kernels/cuda/backend/weight_decode.cuh"

namespace m3::cuda::detail {
namespace {

struct Mismatch {
  int count;
  uint32_t scale, got, want, word;
};

__device__ void record(Mismatch* m, uint32_t scale, uint32_t got, uint32_t want, uint32_t word) {
  if (atomicAdd(&m->count, 1) == 0) {
    m->scale = scale;
    m->got = got;
    m->want = want;
    m->word = word;
  }
}

// Block: one UE8M0 exponent (scales[blockIdx.x] == blockIdx.x); thread: one byte pattern (every
// byte value appears in every byte position of the chunk).
__global__ void check_mxfp8(const uint8_t* scales, Mismatch* m) {
  const uint32_t S = blockIdx.x, b = threadIdx.x;
  const FastScale fs = load_fast_scale<WeightKind::kMxfp8>(scales + S, 0);
  const ChunkScale cs = load_chunk_scale<WeightKind::kMxfp8>(scales + S, 0);
  if (mx_exponent_of(fs.pair[0]) != S) record(m, S, mx_exponent_of(fs.pair[0]), S, 0);
  if (S > kMxfp8FastMaxExp) return;
  const uint32_t w = b | ((b ^ 0x80u) << 8) | ((255u - b) << 16) | (((b * 7u) & 0xFFu) << 24);
  const uint4 raw = make_uint4(w, w ^ 0x01010101u, w ^ 0x80808080u, w ^ 0x7F00FF00u);
  for (int s = 0; s < 2; ++s) {
    const uint4 n = decode_sub_fast<WeightKind::kMxfp8>(raw, s, fs), o = decode_sub<WeightKind::kMxfp8>(raw, s, cs);
    const uint32_t nn[4] = {n.x, n.y, n.z, n.w}, oo[4] = {o.x, o.y, o.z, o.w};
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const uint32_t got = (nn[i] >> (16 * h)) & 0xFFFFu, want = (oo[i] >> (16 * h)) & 0xFFFFu;
        if ((want & 0x7F80u) == 0x7F80u && (want & 0x7Fu) != 0) continue;  // E4M3 NaN codes: not weights
        if (got != want) record(m, S, got, want, s == 0 ? raw.x : raw.z);
      }
  }
}

// Block: one pair of group scales (scales[2 i], scales[2 i + 1]); thread: one nibble pattern.
__global__ void check_nvfp4(const uint8_t* scales, Mismatch* m) {
  const uint8_t* pair = scales + 2 * blockIdx.x;
  if ((pair[0] & 0x7Fu) == 0x7Fu || (pair[1] & 0x7Fu) == 0x7Fu || ((pair[0] | pair[1]) & 0x80u)) return;
  const FastScale fs = load_fast_scale<WeightKind::kNvfp4>(pair, 0);
  const ChunkScale cs = load_chunk_scale<WeightKind::kNvfp4>(pair, 0);
  const uint32_t t = threadIdx.x;
  const uint32_t w = t | (((t * 37u) & 0xFFu) << 8) | ((t ^ 0xA5u) << 16) | ((255u - t) << 24);
  const uint4 raw = make_uint4(w, w ^ 0x88888888u, (w << 4) | (w >> 28), ~w);
  for (int s = 0; s < 4; ++s) {
    const uint4 n = decode_sub_fast<WeightKind::kNvfp4>(raw, s, fs), o = decode_sub<WeightKind::kNvfp4>(raw, s, cs);
    const uint32_t nn[4] = {n.x, n.y, n.z, n.w}, oo[4] = {o.x, o.y, o.z, o.w};
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const uint32_t got = (nn[i] >> (16 * h)) & 0xFFFFu, want = (oo[i] >> (16 * h)) & 0xFFFFu;
        const float scaled = __uint_as_float(got << 16) * float(1 << kNvfp4AccShift);
        if (__float_as_uint(scaled) != want << 16) record(m, blockIdx.x, got, want, w);
      }
  }
}

// Every float (2^32 bit patterns, 64 per thread): the device's E4M3 encode (the conversion
// instruction) against the integer rule, and e2m1_encode_scaled at scale 1 against e2m1_encode.
__global__ void check_fp8_and_e2m1(Mismatch* fp8, Mismatch* e2m1) {
  const uint32_t first = (blockIdx.x * blockDim.x + threadIdx.x) * 64u;
  const E2m1Bounds unit = e2m1_bounds(1.0f);
  for (uint32_t i = 0; i < 64; ++i) {
    const uint32_t u = first + i;
    const float x = __uint_as_float(u);
    const uint8_t got = fp8_e4m3_encode(x), want = fp8_e4m3_encode_bits(x);
    if (got != want) record(fp8, u, got, want, 0);
    const uint8_t c = e2m1_encode_scaled(x, unit), cc = e2m1_encode(x);
    if (c != cc) record(e2m1, u, c, cc, 0);
  }
}

// Every float (2^32 bit patterns, 64 per thread): f32_to_bf16_bits against bf16_encode, and the
// conversion instruction alone against it where the input is not NaN.
__global__ void check_bf16(Mismatch* m) {
  const uint32_t first = (blockIdx.x * blockDim.x + threadIdx.x) * 64u;
  for (uint32_t i = 0; i < 64; ++i) {
    const uint32_t u = first + i;
    const float x = __uint_as_float(u);
    const uint16_t want = bf16_encode(x), got = f32_to_bf16_bits(x);
    const uint16_t raw = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    if (got != want || (x == x && raw != want)) record(m, u, got == want ? raw : got, want, 0);
  }
}

// Every E4M3 byte: the device's decode (the conversion instruction) against the integer rule.
__global__ void check_fp8_decode(Mismatch* m) {
  const uint8_t b = static_cast<uint8_t>(threadIdx.x);
  const uint32_t got = __float_as_uint(fp8_e4m3_decode(b)), want = __float_as_uint(fp8_e4m3_decode_bits(b));
  if (got != want) record(m, b, got, want, 0);
}

}  // namespace
}  // namespace m3::cuda::detail

int main() {
  using namespace m3::cuda::detail;
  uint8_t host_scales[512];
  for (int i = 0; i < 256; ++i) host_scales[i] = uint8_t(i);
  uint8_t *mx_scales = nullptr, *fp4_scales = nullptr;
  Mismatch* m = nullptr;
  cudaMalloc(&mx_scales, 256);
  cudaMemcpy(mx_scales, host_scales, 256, cudaMemcpyHostToDevice);
  for (int i = 0; i < 256; ++i) {
    host_scales[2 * i] = uint8_t(i);
    host_scales[2 * i + 1] = uint8_t(i ^ 0x15);
  }
  cudaMalloc(&fp4_scales, 512);
  cudaMemcpy(fp4_scales, host_scales, 512, cudaMemcpyHostToDevice);
  constexpr int kChecks = 6;
  cudaMalloc(&m, kChecks * sizeof(Mismatch));
  cudaMemset(m, 0, kChecks * sizeof(Mismatch));
  check_mxfp8<<<256, 256>>>(mx_scales, m);
  check_nvfp4<<<256, 256>>>(fp4_scales, m + 1);
  check_fp8_and_e2m1<<<(1u << 26) / 256, 256>>>(m + 2, m + 3);
  check_fp8_decode<<<1, 256>>>(m + 4);
  check_bf16<<<(1u << 26) / 256, 256>>>(m + 5);
  Mismatch h[kChecks] = {};
  const cudaError_t e = cudaMemcpy(h, m, sizeof(h), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    std::printf("weight_decode_check: CUDA error %s\n", cudaGetErrorString(e));
    return 1;
  }
  // "scale" is the input's bits for the three format checks.
  const char* names[kChecks] = {"mxfp8", "nvfp4", "fp8_e4m3_encode (all floats)", "e2m1_encode_scaled at scale 1 (all floats)",
                                "fp8_e4m3_decode (all bytes)", "f32_to_bf16_bits (all floats)"};
  bool failed = false;
  for (int i = 0; i < kChecks; ++i) {
    std::printf("weight_decode_check %s: %d mismatches", names[i], h[i].count);
    if (h[i].count)
      std::printf(" (first: scale %08x, got %08x, want %08x, word %08x)", h[i].scale, h[i].got, h[i].want, h[i].word);
    std::printf("\n");
    failed = failed || h[i].count != 0;
  }
  return failed;
}
