// Writes the step's K and V rows [T, kv_heads, head_dim] into their cache slots (float32 or
// float16 caches). A negative slot marks a padding row (a captured decode graph run with fewer
// sequences than it was recorded for): it writes nothing.
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/element.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

template <typename C>
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v, const int32_t* __restrict__ slots,
                                C* __restrict__ kc, C* __restrict__ vc, int64_t row) {
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    store(kc + slot * row + i, k[t * row + i]);
    store(vc + slot * row + i, v[t * row + i]);
  }
}

}  // namespace

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache,
                    const ops::KvQuant* quant) {
  RV_CHECK(!quant, "CUDA kv_cache_write: float8_e4m3 / int8 KV caches are not built for CUDA yet");
  const int64_t T = k.size(0);
  if (T == 0) return;
  const int32_t* slots = slot_mapping.ptr<int32_t>();
  if (k_cache.dtype() == DType::kF32)
    kv_write_kernel<<<unsigned(T), 128, 0, stream()>>>(k.ptr<float>(), v.ptr<float>(), slots, k_cache.ptr<float>(),
                                                       v_cache.ptr<float>(), k.numel() / T);
  else if (k_cache.dtype() == DType::kF16)
    kv_write_kernel<<<unsigned(T), 128, 0, stream()>>>(k.ptr<float>(), v.ptr<float>(), slots, k_cache.ptr<__half>(),
                                                       v_cache.ptr<__half>(), k.numel() / T);
  else
    throw std::invalid_argument("CUDA kv_cache_write: the cache must be float32 or float16");
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
