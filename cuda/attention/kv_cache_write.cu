// Writes the step's K and V rows [T, kv_heads, head_dim] into their cache slots, in the cache's
// format (kv_elements.cuh): a warp per row, so that an int8 row's scale comes from one warp
// reduction. A negative slot marks a padding row (a captured decode graph run with fewer sequences
// than it was recorded for): it writes nothing.
#include "attention/kv_elements.cuh"
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;

// Grid T: block t's warps take the token's K rows, then its V rows.
template <typename C>
__global__ void kv_write_kernel(const float* __restrict__ k, const float* __restrict__ v, const int32_t* __restrict__ slots,
                                C* __restrict__ kc, C* __restrict__ vc, int KVH, int D, float inv_k, float inv_v,
                                float* __restrict__ k_rows, float* __restrict__ v_rows) {
  const int64_t t = blockIdx.x, slot = slots[t];
  if (slot < 0) return;
  for (int r = int(threadIdx.x / 32); r < 2 * KVH; r += kWarps) {
    const bool is_k = r < KVH;
    const int h = is_k ? r : r - KVH;
    const int64_t row = slot * KVH + h;
    store_row_warp((is_k ? kc : vc) + row * D, is_k ? k_rows + row : v_rows + row, (is_k ? k : v) + (t * KVH + h) * D, D,
                   is_k ? inv_k : inv_v);
  }
}

template <typename C>
void launch(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache,
            const ops::KvQuant* quant) {
  const int64_t T = k.size(0);
  float* k_rows = quant && quant->k_rows.defined() ? quant->k_rows.ptr<float>() : nullptr;
  float* v_rows = quant && quant->v_rows.defined() ? quant->v_rows.ptr<float>() : nullptr;
  kv_write_kernel<C><<<unsigned(T), 32 * kWarps, 0, stream()>>>(
      k.ptr<float>(), v.ptr<float>(), slot_mapping.ptr<int32_t>(), k_cache.ptr<C>(), v_cache.ptr<C>(),
      int(k_cache.size(2)), int(k_cache.size(3)), quant ? 1.0f / quant->k : 1.0f, quant ? 1.0f / quant->v : 1.0f, k_rows,
      v_rows);
}

}  // namespace

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache,
                    const ops::KvQuant* quant) {
  if (k.size(0) == 0) return;
  switch (k_cache.dtype()) {
    case DType::kF32: launch<float>(k, v, slot_mapping, k_cache, v_cache, quant); break;
    case DType::kF16: launch<__half>(k, v, slot_mapping, k_cache, v_cache, quant); break;
    case DType::kF8E4M3: launch<Fp8>(k, v, slot_mapping, k_cache, v_cache, quant); break;
    case DType::kI8: launch<int8_t>(k, v, slot_mapping, k_cache, v_cache, quant); break;
    default: throw std::invalid_argument("CUDA kv_cache_write: no kernel for a " + std::string(dtype_name(k_cache.dtype())) + " cache");
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
