// The mbarrier operations a producer/consumer ring of shared-memory stages needs, with copies
// made by cp.async (16 bytes per lane) whose completion arrives on the stage's barrier.
//
// A stage's "full" barrier expects one arrival per producer lane: each lane issues its cp.asyncs
// for the stage, then cp.async.mbarrier.arrive.noinc, which arrives once those copies have landed.
// Its "empty" barrier expects one arrival per consumer warp. Phases alternate: a waiter passes
// parity p once the phase of parity p has completed, so a fresh barrier lets a producer's first
// wait on parity 1 through at once.
#pragma once
#include <cstdint>

namespace m3::cuda::detail {

__device__ __forceinline__ uint32_t mbar_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbar_addr(bar)), "r"(arrivals) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mbar_addr(bar)) : "memory");
}

// Arrives on `bar` when every cp.async this thread issued before it has completed.
__device__ __forceinline__ void mbar_arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(mbar_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(mbar_addr(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace m3::cuda::detail
