// Dense linear layer out[M, N] = x[M, K] . W[N, K]^T (+ bias) with f32 or f16 weights and f32
// accumulation, for the SM70 instruction set.
//  - decode-sized M (<= 8): a GEMV per warp, each warp streaming one weight row with 16-byte loads
//    and keeping M accumulators per lane: bound by the weight bytes, as decode is;
//  - larger M with f16 weights: tensor-core tiles (gemm_tensor_core.cuh);
//  - larger M with f32 weights: a shared-memory tiled SIMT GEMM (64 x 64 tiles).
#include <cuda_fp16.h>

#include "gemm/gemm_tensor_core.cuh"

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ void load8(const float* p, float (&w)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

__device__ __forceinline__ void load8(const __half* p, float (&w)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    w[2 * i] = f.x, w[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename W, int M>
__global__ void gemv_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ out, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarpsPerBlock + warp;
  if (n >= N) return;
  const W* row = w + size_t(n) * K;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(row) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(x) % 16 == 0);
  int k = 0;
  if (vec) {
    // Two 8-element loads per lane in flight per iteration: decode is bound by how many weight
    // bytes are outstanding, not by arithmetic.
    k = lane * 8;
    for (; k + 32 * 8 + 8 <= K; k += 2 * 32 * 8) {
      float wa[8], wb[8];
      load8(row + k, wa);
      load8(row + k + 32 * 8, wb);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xa[8], xb[8];  // activations as 16-byte loads too (rows are 32-byte aligned: K % 8 == 0)
        load8(x + size_t(m) * K + k, xa);
        load8(x + size_t(m) * K + k + 32 * 8, xb);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wa[i] * xa[i] + wb[i] * xb[i];
      }
    }
    for (; k + 8 <= K; k += 32 * 8) {
      float wv[8];
      load8(row + k, wv);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[8];
        load8(x + size_t(m) * K + k, xv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wv[i] * xv[i];
      }
    }
    k = K;  // every element was covered by some lane
  }
  for (int kk = k + lane; kk < K; kk += 32) {
    const float wv = to_float(row[kk]);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] += wv * x[size_t(m) * K + kk];
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float v = acc[m];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[size_t(m) * N + n] = v + (bias ? bias[n] : 0.0f);
  }
}

constexpr int kTile = 64, kTileK = 16;

template <typename W>
__global__ void gemm_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ out, int M, int N, int K) {
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 256 threads: 16 x 16, 4 x 4 outputs each
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += 256) {
      const int r = i / kTileK, c = i % kTileK;
      xs[c][r] = (m0 + r < M && k0 + c < K) ? x[size_t(m0 + r) * K + k0 + c] : 0.0f;
      ws[c][r] = (n0 + r < N && k0 + c < K) ? to_float(w[size_t(n0 + r) * K + k0 + c]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kTileK; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[c][ty * 4 + i], b[i] = ws[c][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m < M && n < N) out[size_t(m) * N + n] = acc[i][j] + (bias ? bias[n] : 0.0f);
    }
}

template <typename W>
void run(const Tensor& x, const W* w, const float* bias, Tensor& out, int M, int N, int K) {
  if (M <= 8) {
    const unsigned blocks = unsigned((N + kWarpsPerBlock - 1) / kWarpsPerBlock), threads = 32 * kWarpsPerBlock;
    const float* xp = x.ptr<float>();
    float* op = out.ptr<float>();
    switch (M) {
#define RV_GEMV_CASE(m) \
  case m: gemv_kernel<W, m><<<blocks, threads, 0, stream()>>>(xp, w, bias, op, N, K); break;
      RV_GEMV_CASE(1) RV_GEMV_CASE(2) RV_GEMV_CASE(3) RV_GEMV_CASE(4)
      RV_GEMV_CASE(5) RV_GEMV_CASE(6) RV_GEMV_CASE(7) RV_GEMV_CASE(8)
#undef RV_GEMV_CASE
    }
  } else if (!tensor_core_gemm(x.ptr<float>(), w, bias, out.ptr<float>(), M, N, K)) {
    dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
    gemm_kernel<W><<<grid, 256, 0, stream()>>>(x.ptr<float>(), w, bias, out.ptr<float>(), M, N, K);
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  const int64_t K = weight.size(1), N = weight.size(0), M = x.numel() / K;
  RV_CHECK(out.numel() == M * N, "CUDA linear: x ", x.shape_str(), " weight ", weight.shape_str());
  if (M == 0) return;
  const float* b = bias && bias->defined() ? bias->ptr<float>() : nullptr;
  if (weight.dtype() == DType::kF32) run(x, weight.ptr<float>(), b, out, int(M), int(N), int(K));
  else if (weight.dtype() == DType::kF16) run(x, weight.ptr<__half>(), b, out, int(M), int(N), int(K));
  else throw std::invalid_argument("CUDA linear: weights must be float32 or float16 (bf16 is converted at load)");
}

}  // namespace revolta::cuda
