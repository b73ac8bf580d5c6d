// The residual add + RMSNorm run by the last block of a GEMV-like kernel (ops::ResidualNorm): the
// blocks write their part of y, count themselves in, and the last to arrive finishes the rows, so
// a decode step needs no separate norm launch after its layer's last GEMV. The counters reset
// themselves (kernels on the stream run one after another), so a captured graph replays them.
#pragma once

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {

// Device counters, all zero between kernels; slot i for the i-th independent group of a launch.
unsigned* arrival_counters();
constexpr int kArrivalCounters = 1024;

// True in the block that arrives last of `total` on `counter` (after every block's writes are
// visible device-wide); that block also zeroes the counter. Every thread of every block calls it.
__device__ inline bool last_to_arrive(unsigned* counter, unsigned total) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == total - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();  // order the reads below after the other blocks' writes
  return last;
}

// Reads another block's output through L2 (L1 is not coherent across blocks).
__device__ inline float load_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// residual[0, n) += y; normed = residual / rms * w, by the whole block (blockDim a multiple of 32).
__device__ inline void residual_norm_row(float* residual, const float* y, const float* __restrict__ w, float eps,
                                         float* normed, int n) {
  __shared__ float sums[32];
  __shared__ float total;
  constexpr int kBatch = 8;  // loads issued before any is used: one memory latency per batch
  float ss = 0.0f;
  for (int base = 0; base < n; base += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      v[u] = i < n ? load_cg(y + i) + residual[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      if (i < n) residual[i] = v[u];
      ss += v[u] * v[u];
    }
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) total = v;
  }
  __syncthreads();
  const float inv = rsqrtf(total / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) normed[i] = w[i] * (residual[i] * inv);
  __syncthreads();  // sums / total are reused by the next row
}

}  // namespace revolta::cuda
