// SwiGLU: out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i].
#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__global__ void silu_mul_kernel(const float* __restrict__ gu, float* __restrict__ out, int64_t rows, int64_t I) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * I; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / I, c = idx % I;
    const float a = gu[r * 2 * I + c], u = gu[r * 2 * I + I + c];
    out[idx] = silu(a) * u;
  }
}

}  // namespace

void silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t I = out.size(-1), rows = out.numel() / I;
  if (rows == 0) return;
  const int64_t n = rows * I;
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65535));
  silu_mul_kernel<<<blocks, 256, 0, stream()>>>(gate_up.ptr<float>(), out.ptr<float>(), rows, I);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
