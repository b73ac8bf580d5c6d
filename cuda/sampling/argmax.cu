// Greedy sampling on the device: the index of each row's largest logit (lowest index on ties,
// as the CPU sampler), so a greedy batch copies R token ids to the host instead of R x vocab logits.
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__global__ void argmax_kernel(const float* __restrict__ x, int64_t V, int32_t* __restrict__ out) {
  const float* row = x + blockIdx.x * V;
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (better(row[v], int(v), best, idx)) best = row[v], idx = int(v);
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(ov, oi, best, idx)) best = ov, idx = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[warp] = best, si[warp] = idx;
  __syncthreads();
  if (warp == 0) {
    best = lane < blockDim.x / 32 ? sv[lane] : -INFINITY;
    idx = lane < blockDim.x / 32 ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (better(ov, oi, best, idx)) best = ov, idx = oi;
    }
    if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
  }
}

}  // namespace

void argmax(const Tensor& x, Tensor& out) {
  const int64_t R = out.numel();
  if (R == 0) return;
  argmax_kernel<<<unsigned(R), 1024, 0, stream()>>>(x.ptr<float>(), x.numel() / R, out.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
