// DFlash2's grouped dynamic causal conv (contract in ops.h): a thread per (row, channel), its taps
// reading the same channel of earlier rows of its draft block.
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__global__ void dynamic_conv_kernel(const float* __restrict__ x, const float* __restrict__ dynamic, int64_t stride,
                                    int64_t column, int64_t groups, const float* __restrict__ base, int64_t K,
                                    const int32_t* __restrict__ first_row, int64_t C, float* __restrict__ out) {
  const int64_t r = blockIdx.y, width = C / groups;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const float* dyn = dynamic + r * stride + column + c / width;
  float acc = 0.0f;
  for (int64_t t = 0; t < K && r - t >= first_row[r]; ++t) acc += (base[t * C + c] + dyn[t * groups]) * x[(r - t) * C + c];
  out[r * C + c] = acc;
}

}  // namespace

void dynamic_conv(const Tensor& x, const Tensor& dynamic, int64_t column, int64_t groups, const Tensor& base,
                  const Tensor& first_row, Tensor& out) {
  const int64_t R = x.size(0), C = x.size(1);
  if (R == 0) return;
  constexpr int kThreads = 256;
  dynamic_conv_kernel<<<dim3(unsigned((C + kThreads - 1) / kThreads), unsigned(R)), kThreads, 0, stream()>>>(
      x.ptr<float>(), dynamic.ptr<float>(), dynamic.size(1), column, groups, base.ptr<float>(), base.size(0),
      first_row.ptr<int32_t>(), C, out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
