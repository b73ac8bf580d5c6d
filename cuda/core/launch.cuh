// Programmatic dependent launch (compute capability 9.0 and newer): a decode step is a chain of
// short kernels, and each one otherwise pays its launch and its first memory round trip after the
// previous one has fully drained. Kernels launched through launch_dependent() may be scheduled
// while their predecessor's last blocks still run; they load what does not depend on it (their
// first weights) and call wait_for_predecessor() before touching anything the predecessor
// writes or reads. Every kernel launched this way must call it before its first such access.
//
// The instructions exist only in code built for sm_90 and newer; on older devices, and for code
// built for older architectures (the SM70 lane's PTX run on a newer GPU), launches are plain.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {

// Launches with the attributes asked for: dependent (see above, where enabled) and cooperative
// (every block resident at once, or the launch fails: for kernels whose blocks wait for each other).
template <typename... Params, typename... Args>
void launch_with(bool dependent, bool cooperative, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                 Args&&... args) {
  dependent = dependent && dependent_launch_enabled();
  if (!dependent && !cooperative) {
    kernel<<<grid, block, smem, stream()>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream();
  cudaLaunchAttribute attributes[2] = {};
  unsigned n = 0;
  if (dependent) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cooperative) {
    attributes[n].id = cudaLaunchAttributeCooperative;
    attributes[n++].val.cooperative = 1;
  }
  config.attrs = attributes;
  config.numAttrs = n;
  RV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  launch_with(true, false, kernel, grid, block, smem, std::forward<Args>(args)...);
}

// Lets the next kernel of the stream be scheduled (once every block of this one has called it or
// exited); this kernel keeps running.
__device__ __forceinline__ void let_successor_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the previous kernel has completed and its writes are visible (a no-op when this
// kernel was launched plainly).
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Both, for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void enter_dependent() {
  let_successor_launch();
  wait_for_predecessor();
}

}  // namespace revolta::cuda
