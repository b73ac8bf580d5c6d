// Reductions over the 32 lanes of a warp by butterfly shuffles: every lane ends with the result.
#pragma once

namespace revolta::cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A warp's N partial dot products and its partial sum of squares (the routing kernels' norm and
// router rows), each summed over the warp; lane 0 writes them to row[0, N) and row[N].
template <int N>
__device__ __forceinline__ void warp_dots_and_squares(float (&dot)[N], float ss, float* row) {
  ss = warp_sum(ss);
#pragma unroll
  for (int j = 0; j < N; ++j) dot[j] = warp_sum(dot[j]);
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) row[j] = dot[j];
    row[N] = ss;
  }
}

}  // namespace revolta::cuda
