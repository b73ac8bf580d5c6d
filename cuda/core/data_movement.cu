// Row gathers, column copies, transposes and random fills (the CPU op's contracts).
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__global__ void gather_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ rows, int64_t C,
                                   float* __restrict__ out) {
  enter_dependent();
  const float* src = x + int64_t(rows[blockIdx.x]) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[blockIdx.x * C + c] = src[c];
}

__global__ void copy_columns_kernel(const float* __restrict__ src, int64_t SC, int64_t first, int64_t DC,
                                    float* __restrict__ dst) {
  const float* row = src + blockIdx.x * SC + first;
  for (int64_t c = threadIdx.x; c < DC; c += blockDim.x) dst[blockIdx.x * DC + c] = row[c];
}

__global__ void move_pieces_kernel(const PieceRef* __restrict__ refs, uint8_t* __restrict__ staged, bool to_device) {
  const PieceRef r = refs[blockIdx.x];
  uint8_t* device = reinterpret_cast<uint8_t*>(r.device);
  uint8_t* dst = to_device ? device : staged + r.staged;
  const uint8_t* src = to_device ? staged + r.staged : device;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | r.bytes) & 15) == 0) {
    for (uint64_t i = threadIdx.x; i < r.bytes / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
    for (uint64_t i = threadIdx.x; i < r.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__device__ __forceinline__ void put(float* p, float v) { *p = v; }
__device__ __forceinline__ void put(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void put(uint16_t* p, float v) {  // bfloat16, round to nearest even
  uint32_t bits = __float_as_uint(v);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *p = uint16_t(bits >> 16);
}

template <typename T>
__global__ void fill_kernel(T* __restrict__ p, int64_t n, int64_t cols, ops::FillWindow at, uint64_t seed, float lo,
                            float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    put(p + i, lo + (hi - lo) * ops::uniform_at(seed, uint64_t(at.index(i, cols))));
}

// A 32 x 32 tile per block through shared memory (a padded row: no bank conflicts on the column
// reads), so both the reads and the writes cover whole rows of the tile.
template <typename T>
__global__ void transpose_kernel(const T* __restrict__ x, int64_t R, int64_t C, T* __restrict__ out) {
  __shared__ T tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y)
    if (r0 + i < R && c0 + threadIdx.x < C) tile[i][threadIdx.x] = x[(r0 + i) * C + c0 + threadIdx.x];
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y)
    if (c0 + i < C && r0 + threadIdx.x < R) out[(c0 + i) * R + r0 + threadIdx.x] = tile[threadIdx.x][i];
}

}  // namespace

void transpose(const Tensor& x, Tensor& out) {
  const int64_t R = x.size(0), C = x.size(1);
  if (R == 0 || C == 0) return;
  RV_CHECK((R + 31) / 32 <= 65535, "CUDA transpose: ", R, " rows is more than a grid's 65535 tiles of 32 cover");
  const dim3 grid(unsigned((C + 31) / 32), unsigned((R + 31) / 32)), block(32, 8);
  if (dtype_size(x.dtype()) == 2)
    transpose_kernel<<<grid, block, 0, stream()>>>(static_cast<const uint16_t*>(x.data()), R, C, static_cast<uint16_t*>(out.data()));
  else
    transpose_kernel<<<grid, block, 0, stream()>>>(static_cast<const uint32_t*>(x.data()), R, C, static_cast<uint32_t*>(out.data()));
  RV_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int64_t R = rows.numel();
  if (R == 0) return;
  launch_dependent(gather_rows_kernel, dim3(unsigned(R)), dim3(256), 0, x.ptr<float>(), rows.ptr<int32_t>(),
                   out.numel() / R, out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void move_pieces(const PieceRef* refs, int64_t count, uint8_t* staged, bool to_device) {
  if (count == 0) return;
  move_pieces_kernel<<<unsigned(count), 256, 0, stream()>>>(refs, staged, to_device);
  RV_CUDA_CHECK(cudaGetLastError());
}

void copy_columns(const Tensor& src, int64_t first, Tensor& dst) {
  const int64_t T = src.size(0);
  if (T == 0) return;
  const int64_t SC = src.numel() / T, DC = dst.numel() / T;
  RV_CHECK(first + DC <= SC, "copy_columns: columns [", first, ", ", first + DC, ") of ", SC);
  copy_columns_kernel<<<unsigned(T), 256, 0, stream()>>>(src.ptr<float>(), SC, first, DC, dst.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi, const ops::FillWindow& at) {
  const int64_t n = t.numel(), cols = t.dim() >= 2 ? n / t.size(0) : n;
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65535));
  switch (t.dtype()) {
    case DType::kF32: fill_kernel<<<blocks, 256, 0, stream()>>>(t.ptr<float>(), n, cols, at, seed, lo, hi); break;
    case DType::kF16: fill_kernel<<<blocks, 256, 0, stream()>>>(t.ptr<__half>(), n, cols, at, seed, lo, hi); break;
    case DType::kBF16: fill_kernel<<<blocks, 256, 0, stream()>>>(t.ptr<uint16_t>(), n, cols, at, seed, lo, hi); break;
    default: throw std::invalid_argument("CUDA fill_uniform: float tensors only");
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
