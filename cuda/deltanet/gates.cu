// Elementwise gates and the MoE combine on the device (contracts in ops/ops.h).
#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__global__ void sigmoid_mul_kernel(float* __restrict__ x, const float* __restrict__ g, int64_t n, int64_t P, int64_t G,
                                   int64_t column) {
  enter_dependent();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= sigmoid(g[(i / P) * G + column + i % P]);
}

__global__ void gdn_gates_kernel(const float* __restrict__ fused, int64_t width, int64_t first, const float* __restrict__ neg_a,
                                 const float* __restrict__ dt_bias, int Hv, float* __restrict__ beta, float* __restrict__ g) {
  const int64_t t = blockIdx.x;
  const float* row = fused + t * width + first;
  for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
    beta[t * Hv + h] = sigmoid(row[h]);
    g[t * Hv + h] = neg_a[h] * softplus(row[Hv + h] + dt_bias[h]);
  }
}

// One block per routed row; rows repeat only across experts, which run one after another.
__global__ void scatter_add_kernel(float* __restrict__ out, const int32_t* __restrict__ rows, const float* __restrict__ w,
                                   const float* __restrict__ y, int64_t H) {
  float* o = out + int64_t(rows[blockIdx.x]) * H;
  const float* yi = y + blockIdx.x * H;
  const float wi = w[blockIdx.x];
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) o[d] += wi * yi[d];
}

__global__ void add_gated_kernel(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ gate, int64_t H) {
  const float s = sigmoid(gate[blockIdx.x]);
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) out[blockIdx.x * H + d] += s * y[blockIdx.x * H + d];
}

}  // namespace

void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column) {
  const int64_t n = x.numel(), T = gate.size(0);
  if (n == 0 || T == 0) return;
  const int64_t P = n / T, G = gate.numel() / T;
  RV_CHECK(n == T * P && gate_column + P <= G, "CUDA sigmoid_mul: x ", x.shape_str(), " gate ", gate.shape_str(),
           " from column ", gate_column);
  launch_dependent(sigmoid_mul_kernel, dim3(unsigned(std::min<int64_t>((n + 255) / 256, 65535))), dim3(256), 0,
                   x.ptr<float>(), gate.ptr<float>(), n, P, G, gate_column);
  RV_CUDA_CHECK(cudaGetLastError());
}

void gdn_gates(const Tensor& fused, int64_t first, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta, Tensor& g) {
  const int64_t T = fused.size(0);
  if (T == 0) return;
  gdn_gates_kernel<<<unsigned(T), 64, 0, stream()>>>(fused.ptr<float>(), fused.numel() / T, first, neg_a.ptr<float>(),
                                                     dt_bias.ptr<float>(), int(neg_a.numel()), beta.ptr<float>(),
                                                     g.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y) {
  const int64_t n = rows.numel();
  if (n == 0) return;
  scatter_add_kernel<<<unsigned(n), 256, 0, stream()>>>(out.ptr<float>(), rows.ptr<int32_t>(), weights.ptr<float>(),
                                                        y.ptr<float>(), y.numel() / n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate) {
  const int64_t T = gate.numel();
  if (T == 0) return;
  add_gated_kernel<<<unsigned(T), 256, 0, stream()>>>(out.ptr<float>(), y.ptr<float>(), gate.ptr<float>(), out.numel() / T);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
