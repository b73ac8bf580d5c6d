// Rotate-half RoPE in place on x [T, heads, head_dim] for the first rotary_dim features, with the
// cos/sin tables [max_positions, rotary_dim / 2] on the device (YaRN scaling is in the tables), and
// multimodal positions (ops.h: RopeTables::axes).
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

// With axes, frequency i turns by the position of axis axes[i] (positions [T, num_axes]).
__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ pos, const int32_t* __restrict__ axes,
                            int num_axes, const float* __restrict__ cos_t, const float* __restrict__ sin_t, int heads,
                            int head_dim, int half) {
  const int t = blockIdx.x;
  for (int idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int64_t at = int64_t(pos[int64_t(t) * num_axes + (axes ? axes[i] : 0)]) * half + i;
    float* v = x + (int64_t(t) * heads + h) * head_dim;
    const float x1 = v[i], x2 = v[i + half], c = cos_t[at], s = sin_t[at];
    v[i] = x1 * c - x2 * s;
    v[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

void rope(Tensor& x, const Tensor& positions, const ops::RopeTables& tables) {
  RV_CHECK(tables.cos.device() == Device::kCUDA, "CUDA rope: the cos/sin tables must be on the device");
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2), half = tables.rotary_dim / 2;
  if (T == 0) return;
  const bool multi = tables.axes.defined();
  rope_kernel<<<unsigned(T), 128, 0, stream()>>>(x.ptr<float>(), positions.ptr<int32_t>(),
                                    multi ? tables.axes.ptr<int32_t>() : nullptr, multi ? int(positions.size(1)) : 1,
                                    tables.cos.ptr<float>(),
                                    tables.sin.ptr<float>(), int(heads), int(D), int(half));
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
