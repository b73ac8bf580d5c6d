// A warp's dot products of f16 weight rows with an f32 vector, in pairs (an expert's gate and up
// rows, two rows of a projection): U steps of 8 elements per lane are loaded before any is used,
// so 2 x P x U 16-byte weight loads are in flight per lane. Each lane ends with its share of the
// dots (warp_sum completes them).
#pragma once

#include <cuda_fp16.h>

#include "core/element.cuh"

namespace revolta::cuda {

// x8(k, xv): x[k, k + 8) into xv (from global memory, or from a block's copy in shared memory).
template <int P, int U, typename X8>
__device__ __forceinline__ void paired_row_dots_with(const __half* const (&wa)[P], const __half* const (&wb)[P], X8 x8,
                                                     int H, int lane, float (&a_dot)[P], float (&b_dot)[P]) {
  constexpr int kStep = 32 * 8;
  int k = lane * 8;
  for (; k + (U - 1) * kStep < H; k += U * kStep) {  // H % 8 == 0 (checked by the caller)
    uint4 a[P][U], b[P][U];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int s = 0; s < U; ++s) a[p][s] = load_weight_raw8(wa[p] + k + s * kStep), b[p][s] = load_weight_raw8(wb[p] + k + s * kStep);
#pragma unroll
    for (int s = 0; s < U; ++s) {
      float xv[8];
      x8(k + s * kStep, xv);
#pragma unroll
      for (int p = 0; p < P; ++p) a_dot[p] += dot8(a[p][s], xv), b_dot[p] += dot8(b[p][s], xv);
    }
  }
  for (; k < H; k += kStep) {
    float xv[8];
    x8(k, xv);
#pragma unroll
    for (int p = 0; p < P; ++p) a_dot[p] += dot8(load_weight_raw8(wa[p] + k), xv), b_dot[p] += dot8(load_weight_raw8(wb[p] + k), xv);
  }
}

template <int P, int U>
__device__ __forceinline__ void paired_row_dots(const __half* const (&wa)[P], const __half* const (&wb)[P],
                                                const float* __restrict__ x, int H, int lane, float (&a_dot)[P],
                                                float (&b_dot)[P]) {
  paired_row_dots_with<P, U>(wa, wb, [x](int k, float (&xv)[8]) { load8_input(x + k, xv); }, H, lane, a_dot, b_dot);
}

}  // namespace revolta::cuda
