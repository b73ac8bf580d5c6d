// Token embedding gather: f32 or f16 table rows to f32 activations (bf16 tables are converted to
// f16 at load on this backend, so it has no bf16 path).
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

template <typename T>
__device__ float to_float(T v);
template <>
__device__ float to_float<float>(float v) { return v; }
template <>
__device__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table, float* __restrict__ out,
                                 int64_t hidden) {
  enter_dependent();
  const int64_t t = blockIdx.x;
  const T* row = table + int64_t(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = to_float(row[i]);
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t T = ids.numel(), H = table.size(1);
  if (T == 0) return;
  if (table.dtype() == DType::kF32)
    launch_dependent(embedding_kernel<float>, dim3(unsigned(T)), dim3(256), 0, ids.ptr<int32_t>(), table.ptr<float>(),
                     out.ptr<float>(), H);
  else if (table.dtype() == DType::kF16)
    launch_dependent(embedding_kernel<__half>, dim3(unsigned(T)), dim3(256), 0, ids.ptr<int32_t>(), table.ptr<__half>(),
                     out.ptr<float>(), H);
  else
    throw std::invalid_argument("CUDA embedding: table must be float32 or float16");
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
