// The vision encoder's elementwise ops: LayerNorm (a block per row), GELU and row scatter. Its
// attention is in varlen_attention.cu.
#include <cmath>

#include "core/block_sum.cuh"
#include "core/cuda_check.h"
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

}  // namespace revolta::cuda
