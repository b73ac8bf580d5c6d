// The residual add + RMSNorm run by the last block of a kernel to arrive (core/arrival.cuh) once
// every block has written its part of y (ops::ResidualNorm): no separate norm launch follows.
#pragma once

#include "core/arrival.cuh"
#include "core/block_sum.cuh"

namespace revolta::cuda {

// residual[0, n) += y; normed = residual / rms * w, by the whole block (blockDim a multiple of 32).
// With `before`, residual[0, n) = y + (before + residual): an earlier add that was left to this one.
__device__ inline void residual_norm_row(float* residual, const float* y, const float* __restrict__ w, float eps,
                                         float* normed, int n, const float* before = nullptr) {
  auto old = [&](int i) { return before ? before[i] + residual[i] : residual[i]; };
  __shared__ float sums[32];
  __shared__ float total;
  constexpr int kBatch = 8;  // loads issued before any is used: one memory latency per batch
  float ss = 0.0f;
  if (n <= kBatch * int(blockDim.x)) {  // one batch: the row and the weight stay in registers
    float v[kBatch], wv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = min(u * int(blockDim.x) + int(threadIdx.x), n - 1);
      v[u] = load_l2(y + i) + old(i), wv[u] = w[i];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = u * blockDim.x + threadIdx.x;
      if (i < n) residual[i] = v[u], ss += v[u] * v[u];
    }
    const float inv = rsqrtf(block_sum(ss, sums, total) / float(n) + eps);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = u * blockDim.x + threadIdx.x;
      if (i < n) normed[i] = wv[u] * (v[u] * inv);
    }
    __syncthreads();  // sums / total are reused by the next row
    return;
  }
  for (int base = 0; base < n; base += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      v[u] = i < n ? load_l2(y + i) + old(i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      if (i < n) residual[i] = v[u];
      ss += v[u] * v[u];
    }
  }
  const float inv = rsqrtf(block_sum(ss, sums, total) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) normed[i] = w[i] * (residual[i] * inv);
  __syncthreads();  // sums / total are reused by the next row
}

}  // namespace revolta::cuda
