// Greedy sampling on the device: the index of each row's largest logit (lowest index on ties,
// as the CPU sampler), so a greedy batch copies R token ids to the host instead of R x vocab logits.
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

constexpr int kThreads = 256, kChunk = kThreads * 8;

// The best (value, index) of the block to thread 0 (others get garbage).
__device__ void block_best(float& best, int& idx) {
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
  if (warp != 0) return;
  best = lane < int(blockDim.x / 32) ? sv[lane] : -INFINITY;
  idx = lane < int(blockDim.x / 32) ? si[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (better(ov, oi, best, idx)) best = ov, idx = oi;
  }
}

// Grid (rows, chunks): one block per slice of a row, so a single row (a decode step at
// concurrency 1) is read by many SMs rather than one.
__global__ void __launch_bounds__(kThreads) argmax_chunk_kernel(const float* __restrict__ x, int64_t V,
                                                                float* __restrict__ part_v, int* __restrict__ part_i) {
  enter_dependent();
  const float* row = x + blockIdx.x * V;
  const int64_t lo = int64_t(blockIdx.y) * kChunk, hi = min(V, lo + kChunk);
  float best = -INFINITY;
  int idx = 0x7fffffff;
#pragma unroll 8
  for (int64_t v = lo + threadIdx.x; v < hi; v += kThreads) {
    const float val = row[v];
    if (better(val, int(v), best, idx)) best = val, idx = int(v);
  }
  block_best(best, idx);
  if (threadIdx.x == 0) part_v[blockIdx.x * gridDim.y + blockIdx.y] = best, part_i[blockIdx.x * gridDim.y + blockIdx.y] = idx;
}

__global__ void argmax_merge_kernel(const float* __restrict__ part_v, const int* __restrict__ part_i, int chunks,
                                    int32_t* __restrict__ out) {
  enter_dependent();
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const size_t at = size_t(blockIdx.x) * chunks + c;
    if (better(part_v[at], part_i[at], best, idx)) best = part_v[at], idx = part_i[at];
  }
  block_best(best, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
}

}  // namespace

void argmax(const Tensor& x, Tensor& out) {
  const int64_t R = out.numel();
  if (R == 0) return;
  const int64_t V = x.numel() / R, chunks = (V + kChunk - 1) / kChunk;
  RV_CHECK(chunks <= 65535 && V < 0x7fffffff, "CUDA argmax: rows of ", V, " values");
  Tensor part_v = Tensor::uninitialized({R, chunks}, DType::kF32, Device::kCUDA);
  Tensor part_i = Tensor::uninitialized({R, chunks}, DType::kI32, Device::kCUDA);
  launch_dependent(argmax_chunk_kernel, dim3{unsigned(R), unsigned(chunks)}, dim3(kThreads), 0, x.ptr<float>(), V,
                   part_v.ptr<float>(), part_i.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
  launch_dependent(argmax_merge_kernel, dim3(unsigned(R)), dim3(64), 0, part_v.ptr<float>(), part_i.ptr<int32_t>(),
                   int(chunks), out.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
