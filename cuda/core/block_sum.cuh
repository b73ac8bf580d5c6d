// A sum over the threads of a block, shared by the norm kernels.
#pragma once

#include "core/warp_reduce.cuh"

namespace revolta::cuda {

// The sum of v over the block (blockDim a multiple of 32), in every thread.
__device__ inline float block_sum(float v, float* sums, float& total) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? sums[threadIdx.x] : 0.0f;
    s = warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

}  // namespace revolta::cuda
