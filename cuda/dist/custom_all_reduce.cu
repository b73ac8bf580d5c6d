#include "dist/custom_all_reduce.h"

#include "core/arrival.cuh"
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

__device__ __forceinline__ void store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Block b of every rank meets block b of every other: it tells each peer it reached `value`, then
// waits until every peer told it so. (Blocks of one rank need not meet: block b of each rank
// stages and reads the same elements.)
__device__ void meet(const PeerBuffers& p, int rank, uint64_t value) {
  __syncthreads();
  const int q = threadIdx.x;
  if (q < p.world) {
    __threadfence_system();  // this block's staged data reaches the peers before the flag
    store_release(p.flags[q] + blockIdx.x * kMaxCustomRanks + rank, value);
    const uint64_t* mine = p.flags[rank] + blockIdx.x * kMaxCustomRanks + q;
    while (load_acquire(mine) < value) {
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(512) one_shot_kernel(PeerBuffers p, int rank, float* __restrict__ x, int64_t n) {
  __shared__ uint64_t last;
  if (threadIdx.x == 0) last = p.counts[rank][blockIdx.x];  // the last meeting of this block (its own)
  __syncthreads();
  const uint64_t first = last + 1, second = last + 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  float* mine = p.data[rank];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) mine[i] = x[i];
  meet(p, rank, first);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride) {
    float s = 0.0f;
    for (int q = 0; q < p.world; ++q) s += load_l2(p.data[q] + i);  // rank order: the same bits everywhere
    x[i] = s;
  }
  meet(p, rank, second);  // no rank stages the next call's data while a peer still reads this one's
  if (threadIdx.x == 0) p.counts[rank][blockIdx.x] = second;
}

// Two shots for larger messages: x is cut into world chunks; rank c sums chunk c over the ranks
// (reading a 1 / world share of each peer's data, not all of it), then every rank gathers the
// chunks' sums from their owners. Block b of every rank takes the same part of each chunk, so block
// b's meetings cover every element it reads.
__global__ void __launch_bounds__(512) two_shot_kernel(PeerBuffers p, int rank, float* __restrict__ x, int64_t n) {
  __shared__ uint64_t last;
  if (threadIdx.x == 0) last = p.counts[rank][blockIdx.x];
  __syncthreads();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int W = p.world;
  auto chunk = [&](int c) { return n * c / W; };
  float* mine = p.data[rank];
  for (int c = 0; c < W; ++c)
    for (int64_t i = chunk(c) + first; i < chunk(c + 1); i += stride) mine[i] = x[i];
  meet(p, rank, last + 1);
  for (int64_t i = chunk(rank) + first; i < chunk(rank + 1); i += stride) {
    float s = 0.0f;
    for (int q = 0; q < W; ++q) s += load_l2(p.data[q] + i);  // rank order
    mine[i] = s;  // peers read this chunk's sum from here (they never read it before the next meeting)
    x[i] = s;
  }
  meet(p, rank, last + 2);
  for (int c = 0; c < W; ++c) {
    if (c == rank) continue;
    for (int64_t i = chunk(c) + first; i < chunk(c + 1); i += stride) x[i] = load_l2(p.data[c] + i);
  }
  meet(p, rank, last + 3);
  if (threadIdx.x == 0) p.counts[rank][blockIdx.x] = last + 3;
}

}  // namespace

void launch_custom_all_reduce(const PeerBuffers& peers, int rank, float* x, int64_t n, cudaStream_t stream,
                              bool two_shot) {
  if (two_shot) two_shot_kernel<<<kCustomBlocks, 512, 0, stream>>>(peers, rank, x, n);
  else one_shot_kernel<<<kCustomBlocks, 512, 0, stream>>>(peers, rank, x, n);
  RV_CUDA_CHECK(cudaGetLastError());
}

std::shared_ptr<CustomAllReduce> CustomAllReduce::create(const std::vector<int>& devices, size_t capacity_bytes) {
  const int world = int(devices.size());
  if (world < 1 || world > kMaxCustomRanks) return nullptr;
  for (int a : devices)
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      RV_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) return nullptr;
    }
  const int before = current_device();
  std::shared_ptr<CustomAllReduce> c(new CustomAllReduce);
  c->devices_ = devices;
  c->capacity_ = capacity_bytes;
  c->peers_.world = world;
  for (int r = 0; r < world; ++r) {
    use_device(devices[size_t(r)]);
    for (int other : devices)
      if (other != devices[size_t(r)]) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(other, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else RV_CUDA_CHECK(e);
      }
    RV_CUDA_CHECK(cudaMalloc(&c->peers_.data[r], capacity_bytes));
    const size_t flags = size_t(kCustomBlocks) * kMaxCustomRanks * sizeof(uint64_t), counts = kCustomBlocks * sizeof(uint64_t);
    RV_CUDA_CHECK(cudaMalloc(&c->peers_.flags[r], flags));
    RV_CUDA_CHECK(cudaMalloc(&c->peers_.counts[r], counts));
    RV_CUDA_CHECK(cudaMemset(c->peers_.flags[r], 0, flags));
    RV_CUDA_CHECK(cudaMemset(c->peers_.counts[r], 0, counts));
    RV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  use_device(before);
  return c;
}

CustomAllReduce::~CustomAllReduce() {
  const int before = current_device();
  for (int r = 0; r < peers_.world; ++r) {
    use_device(devices_[size_t(r)]);
    cudaFree(peers_.data[r]);
    cudaFree(peers_.flags[r]);
    cudaFree(peers_.counts[r]);
  }
  use_device(before);
}

}  // namespace revolta::cuda
