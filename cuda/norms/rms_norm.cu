// RMSNorm, plain and with the residual add fused in: one block per row, fp32 throughout.
#include "core/block_sum.cuh"
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kThreads = 512;

// residual may be null (plain norm); otherwise residual += x first and the sum is normalised.
// A row of up to kThreads * kPer values stays in registers: every load of the row is issued
// before the first store (x and residual may not be declared apart), so the block waits on
// memory once, not once per stride.
template <int kPer>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* x, float* residual, const float* __restrict__ w,
                                                            float* __restrict__ out, int n, float eps) {
  enter_dependent();
  const size_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* rr = residual ? residual + row * n : nullptr;
  float v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + k * kThreads;
    v[k] = i < n ? xr[i] + (rr ? rr[i] : 0.0f) : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (rr && i < n) rr[i] = v[k];
    ss += v[k] * v[k];
  }
  __shared__ float sums[32];
  __shared__ float total;
  const float inv = rsqrtf(block_sum(ss, sums, total) / float(n) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i < n) out[row * n + i] = w[i] * (v[k] * inv);
  }
}

// Rows longer than the register-held form: a second pass reads the row again.
__global__ void rms_norm_long_kernel(const float* x, float* residual, const float* __restrict__ w,
                                     float* __restrict__ out, int n, float eps) {
  enter_dependent();
  const size_t row = blockIdx.x;
  const float* xr = x + row * n;
  float* rr = residual ? residual + row * n : nullptr;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float v = xr[i];
    if (rr) {
      v += rr[i];
      rr[i] = v;
    }
    ss += v * v;
  }
  __shared__ float sums[32];
  __shared__ float total;
  const float inv = rsqrtf(block_sum(ss, sums, total) / float(n) + eps);
  const float* src = rr ? rr : xr;
  for (int i = threadIdx.x; i < n; i += kThreads) out[row * n + i] = w[i] * (src[i] * inv);
}

void launch(const Tensor& x, float* residual, const Tensor& weight, float eps, Tensor& out) {
  RV_CHECK(weight.dtype() == DType::kF32, "CUDA rms_norm: norm weights are float32");
  const int64_t n = weight.numel(), rows = x.numel() / n;
  if (rows == 0) return;
  auto go = [&](auto kernel) {
    launch_dependent(kernel, dim3(unsigned(rows)), dim3(kThreads), 0, x.ptr<float>(), residual, weight.ptr<float>(),
                     out.ptr<float>(), int(n), eps);
  };
  if (n <= kThreads) go(rms_norm_kernel<1>);
  else if (n <= 4 * kThreads) go(rms_norm_kernel<4>);
  else if (n <= 8 * kThreads) go(rms_norm_kernel<8>);
  else if (n <= 16 * kThreads) go(rms_norm_kernel<16>);
  else go(rms_norm_long_kernel);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) { launch(x, nullptr, weight, eps, out); }

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  launch(x, residual.ptr<float>(), weight, eps, out);
}

}  // namespace revolta::cuda
