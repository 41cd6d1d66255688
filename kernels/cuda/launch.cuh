// Kernel launches with programmatic dependent launch (PDL, Hopper).
//
// A decode step is a few hundred short kernels in one stream (about 16 a layer). Launched the
// ordinary way, kernel i + 1 is scheduled only once kernel i has drained: each boundary costs the
// launch, the drain of the last CTAs and the ramp of the next grid, about as long as a small
// kernel's work. With PDL (launch attribute ProgrammaticStreamSerialization), kernel i + 1 may be
// launched as soon as every CTA of kernel i has executed griddepcontrol.launch_dependents; its
// CTAs become resident as kernel i's retire and block in griddepcontrol.wait, which returns once
// kernel i has completed and its memory is visible. Stream capture keeps these edges in CUDA
// graphs (programmatic dependencies), so graph replays overlap the same way.
//
// The rule that keeps it exact: every kernel of kernels/cuda is launched through launch_kernel()
// (or carries the attribute through add_programmatic_launch) and calls kernel_prologue() before it
// touches global memory, so nothing it reads or writes can race with the kernel before it;
// everything the kernel does still happens after its predecessor finished, exactly as without
// PDL. Only the scheduling overlaps. A kernel launched the ordinary way (library kernels such as
// cuBLASLt's, grids above the size limit below) starts after its predecessor completes, as always;
// the prologue is a no-op where no programmatic dependency exists.
//
// One exception, for memory no kernel writes: a model's weights (and the per-layer tables of their
// views) are written only by synchronous copies when they are placed on the device, so a kernel
// may read them before its wait. The streamed linear kernel's producer warp does (linear_streamed.cu):
// it fills its ring of weight stages while the kernel before it finishes, and its consumer warps
// wait (grid_dependency_wait) before they read x.
//
// Build with -DM3_CUDA_PDL=OFF to launch every kernel the ordinary way (the prologue stays; it is
// then a no-op): for profilers and sanitizers that do not follow programmatic edges, and to
// measure what PDL gains.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#ifndef M3_CUDA_PDL
#define M3_CUDA_PDL 1
#endif

namespace m3::cuda {

// The first statement of every kernel: wait for the kernels before it in the stream (complete,
// writes visible), then let the next kernel's CTAs be scheduled. Triggering only after the wait
// keeps at most two grids in flight a stream: a waiting grid never holds SM resources that the
// grid it waits for still needs, because a grid's successor is launched only when all of the
// grid's CTAs have passed this point, so all of them are already resident.
__device__ __forceinline__ void kernel_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The wait half of kernel_prologue(), for a warp that has read only never-written memory (weights)
// before it and must not trigger the next grid itself (another warp of its CTA does, after its own
// wait, so that the two-grid bound above still holds).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The launch attribute that lets the kernel start before its predecessor has finished (see the
// header comment), for grids of at most two CTAs per multiprocessor: the decode-shaped launches,
// one wave each, where the boundaries are a large share of the step. A grid that runs in waves
// gains nothing from an earlier start, and its CTAs, resident early and waiting, would hold the
// slots that the predecessor's tail leaves to the other stream's kernels (the shared expert runs
// beside the routed experts): with PDL on every launch, an 8K-token prefill of the M3.1 shape took
// 618 ms instead of 563 (docs/gpu-backend-notes.md, session 24). Not added when built without PDL.
inline void add_programmatic_launch(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attrs) {
  if (!M3_CUDA_PDL) return;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return;
  const dim3 g = cfg.gridDim;
  if (uint64_t(g.x) * g.y * g.z > uint64_t(2) * sms) return;
  cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
  a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
}

// launch_kernel with the grid's CTAs in thread-block clusters of `cluster` CTAs (distributed shared
// memory, cluster barriers); a cluster of one CTA is an ordinary launch.
template <class... Params, class... Args>
cudaError_t launch_cluster_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                                  cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  cfg.attrs = attrs;
  if (uint64_t(cluster.x) * cluster.y * cluster.z > 1) {
    cudaLaunchAttribute& a = attrs[cfg.numAttrs++];
    a = {};
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = cluster.x;
    a.val.clusterDim.y = cluster.y;
    a.val.clusterDim.z = cluster.z;
  }
  add_programmatic_launch(cfg, attrs);
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic launch attribute. The kernel
// must call kernel_prologue() first. Returns the launch's error (also left for cudaGetLastError).
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                          Args&&... args) {
  return launch_cluster_kernel(kernel, grid, block, dim3(1, 1, 1), smem, stream, std::forward<Args>(args)...);
}

}  // namespace m3::cuda
