// Tensor-core GEMM for decode batches of 9..64 rows: out[M, N] = x[M, K] . W[N, K]^T + bias. The
// weights stream from global memory straight into WMMA fragments (W row-major is the col-major B
// operand with ldm = K), x is converted to f16 once, and K is split across blocks so that enough
// weight bytes are in flight to saturate memory; partial sums meet in out through atomicAdd.
// Memory-bound like the GEMV, but with the FMAs on tensor cores (a CUDA-core GEMV at M = 16
// already needs more FP32 throughput than the chip has for its bandwidth).
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace skinny {

using namespace nvcuda;
constexpr int kWarps = 4, kUnroll = 4;

__global__ void to_half_kernel(const float* __restrict__ x, int M, int Mpad, int K, __half* __restrict__ xh) {
  const int m = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x) xh[size_t(m) * K + k] = __float2half_rn(m < M ? x[size_t(m) * K + k] : 0.0f);
}

template <int MF>  // M fragments of 16 rows
__global__ void __launch_bounds__(kWarps * 32) gemm_kernel(const __half* __restrict__ xh, const __half* __restrict__ w,
                                                           const float* __restrict__ bias, float* __restrict__ out, int M,
                                                           int N, int K, int k_split) {
  __shared__ __align__(32) float tile[kWarps][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * 16;
  if (n0 >= N) return;
  const int k0 = blockIdx.y * k_split, k1 = min(K, k0 + k_split);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MF];
#pragma unroll
  for (int i = 0; i < MF; ++i) wmma::fill_fragment(acc[i], 0.0f);
  const __half* wrow = w + size_t(n0) * K;
  int k = k0;
  for (; k + 16 * kUnroll <= k1; k += 16 * kUnroll) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wmma::load_matrix_sync(b[u], wrow + k + 16 * u, K);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int i = 0; i < MF; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::load_matrix_sync(a, xh + size_t(16 * i) * K + k + 16 * u, K);
        wmma::mma_sync(acc[i], a, b[u], acc[i]);
      }
  }
  for (; k < k1; k += 16) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
    wmma::load_matrix_sync(b, wrow + k, K);
#pragma unroll
    for (int i = 0; i < MF; ++i) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
      wmma::load_matrix_sync(a, xh + size_t(16 * i) * K + k, K);
      wmma::mma_sync(acc[i], a, b, acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < MF; ++i) {
    wmma::store_matrix_sync(tile[warp], acc[i], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int m = 16 * i + e / 16, n = n0 + e % 16;
      if (m < M) atomicAdd(out + size_t(m) * N + n, tile[warp][e] + (bias && blockIdx.y == 0 ? bias[n] : 0.0f));
    }
    __syncwarp();
  }
}

}  // namespace skinny

// Runs when it applies (f16 weights, 8 < M <= 64, N and K multiples of 16, aligned); else false.
inline bool skinny_gemm(const float* x, const __half* w, const float* bias, float* out, int M, int N, int K) {
  if (M <= 8 || M > 64 || N % 16 || K % 16 || reinterpret_cast<uintptr_t>(w) % 32) return false;
  const int Mpad = (M + 15) / 16 * 16;
  Tensor xh = Tensor::uninitialized({Mpad, K}, DType::kF16, Device::kCUDA);
  skinny::to_half_kernel<<<unsigned(Mpad), 256, 0, stream()>>>(x, M, Mpad, K, xh.ptr<__half>());
  RV_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(M) * N * sizeof(float), stream()));
  const int n_blocks = (N + 16 * skinny::kWarps - 1) / (16 * skinny::kWarps);
  const int step = 16 * skinny::kUnroll;
  int splits = std::max(1, std::min((4 * sm_count() + n_blocks - 1) / n_blocks, K / (4 * step)));
  const int k_split = (K / splits + step - 1) / step * step;
  splits = (K + k_split - 1) / k_split;
  const dim3 grid{unsigned(n_blocks), unsigned(splits), 1u};
  const __half* xp = xh.ptr<__half>();
  switch (Mpad / 16) {
    case 1: skinny::gemm_kernel<1><<<grid, skinny::kWarps * 32, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    case 2: skinny::gemm_kernel<2><<<grid, skinny::kWarps * 32, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    case 3: skinny::gemm_kernel<3><<<grid, skinny::kWarps * 32, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    default: skinny::gemm_kernel<4><<<grid, skinny::kWarps * 32, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
  }
  RV_CUDA_CHECK(cudaGetLastError());
  return true;
}

inline bool skinny_gemm(const float*, const float*, const float*, float*, int, int, int) { return false; }

}  // namespace revolta::cuda
