// The vision encoder's own ops: LayerNorm (a block per row), GELU, row scatter, and bidirectional
// attention over packed sequences. Attention takes a block per (query row, head): the block walks
// its sequence's keys in tiles of one key per thread (scores), then one output feature per thread
// (weighted values), with an online softmax across tiles. Simple and exact; the patches of one
// image are a few thousand rows, so the quadratic part is small next to the encoder's GEMMs.
#include <cmath>

#include "core/block_sum.cuh"
#include "core/cuda_check.h"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void layer_norm_kernel(const float* x, const float* __restrict__ w, const float* __restrict__ b, float* out,
                                  int n, float eps) {
  const float* xr = x + size_t(blockIdx.x) * n;
  float* o = out + size_t(blockIdx.x) * n;
  __shared__ float sums[32];
  __shared__ float total;
  float s = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, sums, total) / float(n);
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(block_sum(v, sums, total) / float(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

__global__ void gelu_kernel(float* x, int64_t n, bool tanh_approximation) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = tanh_approximation ? 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                              : 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
  }
}

__global__ void scatter_rows_kernel(float* __restrict__ out, const int32_t* __restrict__ rows,
                                    const float* __restrict__ src, int64_t C) {
  const int64_t r = blockIdx.x;
  float* o = out + int64_t(rows[r]) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[r * C + c];
}

// Grid (T, heads); blockDim kThreads; head_dim <= kThreads.
__global__ void varlen_attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, const int32_t* __restrict__ starts, int S, int H,
                                        int D, float scale, float* __restrict__ out) {
  __shared__ float qs[kThreads];
  __shared__ float p[kThreads];
  __shared__ float sums[32];
  __shared__ float total;
  const int t = blockIdx.x, h = blockIdx.y;
  int lo = 0, hi = S;  // the sequence holding row t: starts[s] <= t < starts[s + 1]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (starts[mid] <= t) lo = mid;
    else hi = mid;
  }
  const int j0 = starts[lo], j1 = starts[lo + 1];
  if (threadIdx.x < D) qs[threadIdx.x] = q[(int64_t(t) * H + h) * D + threadIdx.x] * scale;
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int base = j0; base < j1; base += kThreads) {
    const int j = base + threadIdx.x;
    float sc = -INFINITY;
    if (j < j1) {
      const float* kr = k + (int64_t(j) * H + h) * D;
      sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qs[d] * kr[d];
    }
    // the tile's max, then its weights relative to the running max
    float tm = warp_max(sc);
    if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = tm;
    __syncthreads();
    if (threadIdx.x < 32) {
      float x = threadIdx.x < kThreads / 32 ? sums[threadIdx.x] : -INFINITY;
      x = warp_max(x);
      if (threadIdx.x == 0) total = x;
    }
    __syncthreads();
    const float m_new = fmaxf(m, total);
    __syncthreads();
    const float e = j < j1 ? __expf(sc - m_new) : 0.0f;
    p[threadIdx.x] = e;
    const float tile_sum = block_sum(e, sums, total);
    const float correction = __expf(m - m_new);
    l = l * correction + tile_sum;
    if (threadIdx.x < D) {
      float a = acc * correction;
      const int n = min(kThreads, j1 - base);
      for (int i = 0; i < n; ++i) a += p[i] * v[(int64_t(base + i) * H + h) * D + threadIdx.x];
      acc = a;
    }
    m = m_new;
    __syncthreads();
  }
  if (threadIdx.x < D) out[(int64_t(t) * H + h) * D + threadIdx.x] = acc / l;
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  const int64_t n = weight.numel(), rows = x.numel() / n;
  if (rows == 0) return;
  layer_norm_kernel<<<unsigned(rows), kThreads, 0, stream()>>>(x.ptr<float>(), weight.ptr<float>(), bias.ptr<float>(),
                                                               out.ptr<float>(), int(n), eps);
  RV_CUDA_CHECK(cudaGetLastError());
}

void gelu(Tensor& x, bool tanh_approximation) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  gelu_kernel<<<blocks, kThreads, 0, stream()>>>(x.ptr<float>(), n, tanh_approximation);
  RV_CUDA_CHECK(cudaGetLastError());
}

void scatter_rows(Tensor& out, const Tensor& rows, const Tensor& src) {
  const int64_t R = rows.numel();
  if (R == 0) return;
  scatter_rows_kernel<<<unsigned(R), kThreads, 0, stream()>>>(out.ptr<float>(), rows.ptr<int32_t>(), src.ptr<float>(),
                                                             out.size(1));
  RV_CUDA_CHECK(cudaGetLastError());
}

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts, int32_t,
                      float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  RV_CHECK(D <= kThreads, "CUDA varlen_attention: head_dim ", D, " (<= ", kThreads, ")");
  if (T == 0) return;
  varlen_attention_kernel<<<dim3(unsigned(T), unsigned(H)), kThreads, 0, stream()>>>(
      q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), seq_starts.ptr<int32_t>(), int(seq_starts.numel() - 1), int(H),
      int(D), scale, out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
