// Writes the step's K and V rows [T, kv_heads, head_dim] into their cache slots.
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v, const int32_t* __restrict__ slots,
                                float* __restrict__ kc, float* __restrict__ vc, int64_t row) {
  const int64_t t = blockIdx.x, slot = slots[t];
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kc[slot * row + i] = k[t * row + i];
    vc[slot * row + i] = v[t * row + i];
  }
}

}  // namespace

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache) {
  RV_CHECK(k_cache.dtype() == DType::kF32, "CUDA kv_cache_write: float32 cache only so far");
  const int64_t T = k.size(0);
  if (T == 0) return;
  kv_write_kernel<<<unsigned(T), 128>>>(k.ptr<float>(), v.ptr<float>(), slot_mapping.ptr<int32_t>(), k_cache.ptr<float>(),
                                        v_cache.ptr<float>(), k.numel() / T);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
