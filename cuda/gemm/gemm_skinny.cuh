// Tensor-core GEMM for decode batches of up to 64 rows: out[M, N] = x[M, K] . W[N, K]^T + bias.
// Memory-bound like the GEMV, but with the FMAs on tensor cores (a CUDA-core GEMV at M = 16
// already needs more FP32 throughput than the chip has for its bandwidth). A block takes 64
// weight rows and a split of K: 128-column tiles of W and of x (converted to f16 once) come in
// with coalesced 16-byte loads, held in registers while the previous tile's fragments are
// multiplied from shared memory; partial sums of the splits meet in out through atomicAdd.
// (Fragments loaded straight from global memory streamed at a quarter of the bandwidth.)
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {

// From this many rows the tensor-core form beats the CUDA-core GEMV, whose FMAs grow with the rows
// (H200, Llama-8B's projections: equal at about 6; at 8 the decode step took 7.1 against 9.0 ms).
constexpr int kSkinnyMinRows = 6;

namespace skinny {

using namespace nvcuda;
constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps, kTileK = 128, kLd = kTileK + 8;
constexpr int kChunks = kTileK / 8;  // 16-byte chunks in a tile row

__global__ void to_half_kernel(const float* __restrict__ x, int M, int Mpad, int K, __half* __restrict__ xh) {
  const int m = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x) xh[size_t(m) * K + k] = __float2half_rn(m < M ? x[size_t(m) * K + k] : 0.0f);
}

template <int MF>  // M fragments of 16 rows
__global__ void __launch_bounds__(kThreads) gemm_kernel(const __half* __restrict__ xh, const __half* __restrict__ w,
                                                       const float* __restrict__ bias, float* __restrict__ out, int M,
                                                       int N, int K, int k_split) {
  constexpr int kWLoads = kRows * kChunks / kThreads, kXChunks = 16 * MF * kChunks;
  constexpr int kXLoads = (kXChunks + kThreads - 1) / kThreads;
  __shared__ __align__(32) __half ws[kRows * kLd];
  __shared__ __align__(32) __half xs[16 * MF * kLd];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, chunk = threadIdx.x % kChunks;
  const int nb = blockIdx.x * kRows, k0 = blockIdx.y * k_split, k1 = min(K, k0 + k_split);
  uint4 wv[kWLoads], xv[kXLoads];
  auto load = [&](int k) {
#pragma unroll
    for (int i = 0; i < kWLoads; ++i) {  // rows past N re-read the last row (their sums are not stored)
      const int n = min(nb + threadIdx.x / kChunks + i * (kThreads / kChunks), N - 1);
      wv[i] = __ldg(reinterpret_cast<const uint4*>(w + size_t(n) * K + k) + chunk);
    }
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < kXChunks) xv[i] = *(reinterpret_cast<const uint4*>(xh + size_t(c / kChunks) * K + k) + c % kChunks);
    }
  };
  auto store = [&] {
#pragma unroll
    for (int i = 0; i < kWLoads; ++i)
      *reinterpret_cast<uint4*>(ws + (threadIdx.x / kChunks + i * (kThreads / kChunks)) * kLd + chunk * 8) = wv[i];
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < kXChunks) *reinterpret_cast<uint4*>(xs + (c / kChunks) * kLd + (c % kChunks) * 8) = xv[i];
    }
  };
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MF];
#pragma unroll
  for (int i = 0; i < MF; ++i) wmma::fill_fragment(acc[i], 0.0f);
  const bool live = nb + 16 * warp < N;
  load(k0);
  for (int k = k0; k < k1; k += kTileK) {
    __syncthreads();  // the previous tile's fragments are read
    store();
    __syncthreads();
    if (k + kTileK < k1) load(k + kTileK);  // in flight while this tile multiplies
    if (!live) continue;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
      wmma::load_matrix_sync(b, ws + 16 * warp * kLd + kk, kLd);
#pragma unroll
      for (int i = 0; i < MF; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::load_matrix_sync(a, xs + 16 * i * kLd + kk, kLd);
        wmma::mma_sync(acc[i], a, b, acc[i]);
      }
    }
  }
  __syncthreads();  // ws becomes the warps' output tiles
  if (!live) return;
  float* tile = reinterpret_cast<float*>(ws) + warp * 256;
  const int n0 = nb + 16 * warp;
#pragma unroll
  for (int i = 0; i < MF; ++i) {
    wmma::store_matrix_sync(tile, acc[i], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int m = 16 * i + e / 16, n = n0 + e % 16;
      if (m < M) atomicAdd(out + size_t(m) * N + n, tile[e] + (bias && blockIdx.y == 0 ? bias[n] : 0.0f));
    }
    __syncwarp();
  }
}

}  // namespace skinny

// Runs when it applies (f16 weights, kSkinnyMinRows <= M <= 64, N a multiple of 16 and K of 128,
// aligned); else false.
inline bool skinny_gemm(const float* x, const __half* w, const float* bias, float* out, int M, int N, int K) {
  if (M < kSkinnyMinRows || M > 64 || N % 16 || K % skinny::kTileK || reinterpret_cast<uintptr_t>(w) % 16) return false;
  const int Mpad = (M + 15) / 16 * 16;
  Tensor xh = Tensor::uninitialized({Mpad, K}, DType::kF16, Device::kCUDA);
  skinny::to_half_kernel<<<unsigned(Mpad), 256, 0, stream()>>>(x, M, Mpad, K, xh.ptr<__half>());
  RV_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(M) * N * sizeof(float), stream()));
  // Splits of K so that about six blocks per SM stream at once, each at least two tiles long.
  const int n_blocks = (N + skinny::kRows - 1) / skinny::kRows, tiles = K / skinny::kTileK;
  int splits = std::max(1, std::min((6 * sm_count() + n_blocks - 1) / n_blocks, tiles / 2));
  const int k_split = (tiles + splits - 1) / splits * skinny::kTileK;
  splits = (K + k_split - 1) / k_split;
  const dim3 grid{unsigned(n_blocks), unsigned(splits), 1u};
  const __half* xp = xh.ptr<__half>();
  switch (Mpad / 16) {
    case 1: skinny::gemm_kernel<1><<<grid, skinny::kThreads, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    case 2: skinny::gemm_kernel<2><<<grid, skinny::kThreads, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    case 3: skinny::gemm_kernel<3><<<grid, skinny::kThreads, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
    default: skinny::gemm_kernel<4><<<grid, skinny::kThreads, 0, stream()>>>(xp, w, bias, out, M, N, K, k_split); break;
  }
  RV_CUDA_CHECK(cudaGetLastError());
  return true;
}

inline bool skinny_gemm(const float*, const float*, const float*, float*, int, int, int) { return false; }

}  // namespace revolta::cuda
