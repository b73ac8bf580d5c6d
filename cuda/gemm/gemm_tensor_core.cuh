// Dense GEMM on tensor cores for prefill-sized M: out[M, N] = x[M, K] (f32, rounded to f16 as it
// is staged) . W[N, K]^T (f16) + bias, fp32 accumulation, through WMMA 16x16x16 (the V100's HMMA).
// Block tiles BM x BN with a K step of 32; the next step's tiles are loaded into registers while
// the current one is multiplied. Two shapes: 128 x 128 (8 warps) for long prompts, 32 x 32
// (4 warps) when M is small and more blocks are needed to cover the SMs.
//
// The same tiles serve a grouped GEMM (mixture-of-experts prefill): output rows come in groups,
// group g multiplying its rows by its own weight matrix, and an output row may read a gathered
// row of x. Every tile lies within one group; a block finds its group from the tile index.
// Weights may also be stored transposed, W_t[K, N] (kWeightsKN: the experts' down matrices).
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace tc {

using namespace nvcuda;
constexpr int BK = 32, LDS = BK + 8;  // +8 halves of padding: fewer bank conflicts, 32-byte aligned rows

// Output rows [row_first[g], row_first[g + 1]) use weight matrix `weights[g]` (an address) and
// tiles [tile_first[g], tile_first[g + 1]) of BM rows; output row r reads x row rows[r] (null: r).
struct Groups {
  const int32_t* row_first = nullptr;
  const int32_t* tile_first = nullptr;
  const int64_t* weights = nullptr;
  const int32_t* rows = nullptr;
  int count = 0;
};

template <int BM, int BN, int WM, int WN, bool kGrouped = false, bool kWeightsKN = false>  // WM x WN warps
__global__ void __launch_bounds__(WM * WN * 32) gemm_kernel(const float* __restrict__ x, const __half* __restrict__ w,
                                                           const float* __restrict__ bias, float* __restrict__ out,
                                                           int M, int N, int K, Groups groups = {}) {
  constexpr int kThreads = WM * WN * 32, FM = BM / WM / 16, FN = BN / WN / 16;
  constexpr int XV = BM * BK / 4 / kThreads;  // float4 loads of x per thread and step
  constexpr int WV = BN * BK / 8 / kThreads;  // uint4 (8 halves) loads of W per thread and step
  static_assert(XV >= 1 && WV >= 1, "tile too small for the block");
  // The W tile as staged: [BN][BK] (+ padding) from W[N, K], or [BK][BN] (+ padding) from W_t[K, N].
  constexpr int kBRow = kWeightsKN ? BN : BK, LDB = kBRow + 8;
  __shared__ __align__(32) __half As[BM * LDS];
  __shared__ __align__(32) __half Bs[(kWeightsKN ? BK : BN) * LDB];
  __shared__ __align__(32) float Cs[WM * WN][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / WN, wn = warp % WN;
  const int n0 = blockIdx.x * BN;
  int m0 = blockIdx.y * BM;
  if (kGrouped) {  // the group of this tile: the last g with tile_first[g] <= tile
    const int tile = blockIdx.y;
    if (tile >= groups.tile_first[groups.count]) return;  // the grid is an upper bound
    int lo = 0, hi = groups.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (groups.tile_first[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    m0 = groups.row_first[lo] + (tile - groups.tile_first[lo]) * BM;
    M = groups.row_first[lo + 1];  // rows of this group end here
    w = reinterpret_cast<const __half*>(groups.weights[lo]);
  }
  const float* xrow[XV];  // the x row each of this thread's loads reads (gathered when grouped)
#pragma unroll
  for (int i = 0; i < XV; ++i) {
    const int r = m0 + (threadIdx.x + i * kThreads) * 4 / BK;
    xrow[i] = r < M ? x + size_t(kGrouped && groups.rows ? groups.rows[r] : r) * K : nullptr;
  }

  float4 xr[XV];
  uint4 wr[WV];
  auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < XV; ++i) {
      const int c = (threadIdx.x + i * kThreads) * 4 % BK;
      xr[i] = (xrow[i] && k0 + c < K) ? *reinterpret_cast<const float4*>(xrow[i] + k0 + c)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < WV; ++i) {
      const int e = (threadIdx.x + i * kThreads) * 8, r = e / kBRow, c = e % kBRow;
      if (kWeightsKN)  // row r of the tile is k, c is n (N % 8 == 0: eight columns are all in or all out)
        wr[i] = (k0 + r < K && n0 + c < N) ? __ldg(reinterpret_cast<const uint4*>(w + size_t(k0 + r) * N + n0 + c))
                                           : make_uint4(0u, 0u, 0u, 0u);
      else
        wr[i] = (n0 + r < N && k0 + c < K) ? __ldg(reinterpret_cast<const uint4*>(w + size_t(n0 + r) * K + k0 + c))
                                           : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto stage = [&] {
#pragma unroll
    for (int i = 0; i < XV; ++i) {
      const int e = (threadIdx.x + i * kThreads) * 4, r = e / BK, c = e % BK;
      __half2* dst = reinterpret_cast<__half2*>(As + r * LDS + c);
      dst[0] = __floats2half2_rn(xr[i].x, xr[i].y);
      dst[1] = __floats2half2_rn(xr[i].z, xr[i].w);
    }
#pragma unroll
    for (int i = 0; i < WV; ++i) {
      const int e = (threadIdx.x + i * kThreads) * 8, r = e / kBRow, c = e % kBRow;
      *reinterpret_cast<uint4*>(Bs + r * LDB + c) = wr[i];
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  load(0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();
    stage();
    __syncthreads();
    if (k0 + BK < K) load(k0 + BK);  // in flight while the tensor cores work
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[FM];
      using BLayout = std::conditional_t<kWeightsKN, wmma::row_major, wmma::col_major>;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, BLayout> b[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], As + (wm * FM * 16 + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        const int n = wn * FN * 16 + j * 16;
        wmma::load_matrix_sync(b[j], kWeightsKN ? Bs + kk * LDB + n : Bs + n * LDB + kk, LDB);
      }
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
  // Epilogue through a per-warp 16 x 16 scratch: bias, bounds.
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(Cs[warp], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const int rb = m0 + wm * FM * 16 + i * 16, cb = n0 + wn * FN * 16 + j * 16;
      for (int e = lane; e < 256; e += 32) {
        const int r = rb + e / 16, c = cb + e % 16;
        if (r < M && c < N) out[size_t(r) * N + c] = Cs[warp][e] + (bias ? bias[c] : 0.0f);
      }
      __syncwarp();
    }
}

}  // namespace tc

// The grouped form: out[r, :] = x[rows[r] (or r), :] . W_g^T for the rows r of group g (f16
// weights by address, K a multiple of 8, 16-byte aligned; with weights_kn each W_g is stored as
// its transpose [K, N], N a multiple of 8). The grid covers max_tiles tiles of 64 rows, an upper
// bound on the groups' tiles, which are known only on the device.
inline void grouped_gemm(const float* x, const tc::Groups& groups, int max_tiles, float* out, int N, int K,
                         bool weights_kn = false) {
  const dim3 grid(unsigned((N + 63) / 64), unsigned(max_tiles));
  if (weights_kn) tc::gemm_kernel<64, 64, 2, 2, true, true><<<grid, 128, 0, stream()>>>(x, nullptr, nullptr, out, 0, N, K, groups);
  else tc::gemm_kernel<64, 64, 2, 2, true><<<grid, 128, 0, stream()>>>(x, nullptr, nullptr, out, 0, N, K, groups);
  RV_CUDA_CHECK(cudaGetLastError());
}
constexpr int kGroupedTileRows = 64;

// Runs the tensor-core GEMM when it applies (f16 weights, K a multiple of 8, 16-byte aligned
// rows); returns false to let the caller take another path.
inline bool tensor_core_gemm(const float* x, const float* w, const float* bias, float* out, int M, int N, int K) {
  return false;  // f32 weights stay on the SIMT path
}

inline bool tensor_core_gemm(const float* x, const __half* w, const float* bias, float* out, int M, int N, int K) {
  if (K % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(w) % 16) return false;
  if (M >= 128) {
    tc::gemm_kernel<128, 128, 4, 2><<<dim3(unsigned((N + 127) / 128), unsigned((M + 127) / 128)), 256, 0, stream()>>>(
        x, w, bias, out, M, N, K);
  } else {
    tc::gemm_kernel<32, 32, 2, 2><<<dim3(unsigned((N + 31) / 32), unsigned((M + 31) / 32)), 128, 0, stream()>>>(
        x, w, bias, out, M, N, K);
  }
  RV_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace revolta::cuda
