// Token embedding gather: f32 or f16 table rows to f32 activations (bf16 tables are converted to
// f16 at load on this backend, so it has no bf16 path), with the first block's input RMSNorm fused
// in when asked (ops::NormInto): a decode step then starts with one kernel instead of two.
#include <cuda_fp16.h>

#include "core/block_sum.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__device__ __forceinline__ void row8(const float* p, float (&v)[8]) { load8(p, v); }
__device__ __forceinline__ void row8(const __half* p, float (&v)[8]) { unpack8(*reinterpret_cast<const uint4*>(p), v); }

// A block per token. Aligned rows of a multiple of 8 elements (vec) go 8 to a thread per step, so
// that one token's row is one round of 16-byte loads; the normed row reads back out (this block's
// own stores, visible after the sum's barrier).
template <typename T, bool kNorm>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table, float* __restrict__ out,
                                 int64_t hidden, bool vec, const float* __restrict__ weight, float eps,
                                 float* __restrict__ normed) {
  enter_dependent();
  const int64_t t = blockIdx.x;
  const T* row = table + int64_t(ids[t]) * hidden;
  float* o = out + t * hidden;
  float ss = 0.0f;
  if (vec) {
    for (int64_t i = threadIdx.x * 8; i < hidden; i += int64_t(blockDim.x) * 8) {
      float v[8];
      row8(row + i, v);
      reinterpret_cast<float4*>(o + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(o + i)[1] = make_float4(v[4], v[5], v[6], v[7]);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
    }
  } else {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float v = to_float(row[i]);
      o[i] = v, ss += v * v;
    }
  }
  if (!kNorm) return;
  __shared__ float sums[32], total;
  const float inv = rsqrtf(block_sum(ss, sums, total) / float(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) normed[t * hidden + i] = weight[i] * (o[i] * inv);
}

template <typename T>
void launch(const Tensor& ids, const T* table, Tensor& out, int64_t H, const ops::NormInto* norm) {
  const bool vec = H % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out.data()) % 16 == 0;
  const dim3 grid{unsigned(ids.numel())}, block{256};
  if (norm)
    launch_dependent(embedding_kernel<T, true>, grid, block, 0, ids.ptr<int32_t>(), table, out.ptr<float>(), H, vec,
                     norm->weight->ptr<float>(), norm->eps, norm->normed->ptr<float>());
  else
    launch_dependent(embedding_kernel<T, false>, grid, block, 0, ids.ptr<int32_t>(), table, out.ptr<float>(), H, vec,
                     static_cast<const float*>(nullptr), 0.0f, static_cast<float*>(nullptr));
}

// A block per token: its row of the rank's vocabulary slice, or zeros (ops::embedding_shard).
template <typename T>
__global__ void embedding_shard_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table, int64_t first_id,
                                       int64_t rows, int64_t hidden, float* __restrict__ out) {
  enter_dependent();
  const int64_t t = blockIdx.x, local = int64_t(ids[t]) - first_id;
  const bool in = local >= 0 && local < rows;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * hidden + i] = in ? to_float(table[local * hidden + i]) : 0.0f;
}

}  // namespace

void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
  const int64_t T = ids.numel(), V = table.size(0), H = table.size(1);
  if (T == 0) return;
  const dim3 grid{unsigned(T)}, block{256};
  if (table.dtype() == DType::kF32)
    launch_dependent(embedding_shard_kernel<float>, grid, block, 0, ids.ptr<int32_t>(), table.ptr<float>(), first_id, V, H,
                     out.ptr<float>());
  else if (table.dtype() == DType::kF16)
    launch_dependent(embedding_shard_kernel<__half>, grid, block, 0, ids.ptr<int32_t>(), table.ptr<__half>(), first_id, V,
                     H, out.ptr<float>());
  else throw std::invalid_argument("CUDA embedding_shard: table must be float32 or float16");
  RV_CUDA_CHECK(cudaGetLastError());
}

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const ops::NormInto* norm) {
  const int64_t T = ids.numel(), H = table.size(1);
  if (T == 0) return;
  if (table.dtype() == DType::kF32) launch(ids, table.ptr<float>(), out, H, norm);
  else if (table.dtype() == DType::kF16) launch(ids, table.ptr<__half>(), out, H, norm);
  else throw std::invalid_argument("CUDA embedding: table must be float32 or float16");
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
