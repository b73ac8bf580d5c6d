// A sum over the threads of a block, shared by the norm kernels.
#pragma once

namespace revolta::cuda {

// The sum of v over the block (blockDim a multiple of 32), in every thread.
__device__ inline float block_sum(float v, float* sums, float& total) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  return total;
}

}  // namespace revolta::cuda
