// Hand-offs between the blocks of one kernel: the blocks of a group count themselves in on a
// counter and the last to arrive finishes the group's work, reading the others' results through L2
// (split-K attention merges, routing after the router GEMV, the residual norm after the experts).
// The counters are zero between kernels: whoever finishes re-arms them, so captured graphs replay
// them (kernels on the work stream run one after another, so groups of different kernels may share
// counters).
#pragma once

#include <cstdint>

namespace revolta::cuda {

// kArrivalCounters counters, zeroed once (core/backend.cu).
constexpr int64_t kArrivalCounters = int64_t(1) << 16;
int* arrival_counters();

// A load that skips L1: other blocks' results are read right after they were written.
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// A load for spinning on a word another block will write: a volatile load reads the coherence
// point every time, where a weak load in a loop (even ld.cg, whose cache operator is only a hint)
// may keep returning the stale copy it first saw (a poll built on load_l2 spun for seconds on
// words that were long set, H200).
template <typename T>
__device__ __forceinline__ T load_polled(const T* p) {
  return *static_cast<const volatile T*>(p);
}

__device__ __forceinline__ float4 load_l2(const float4* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// True in the block that arrives last of `total` on `counter` (after every block's writes are
// visible device-wide); that block also re-arms the counter. Every thread of every block calls it.
__device__ inline bool last_to_arrive(int* counter, int total) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == total - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();  // order the reads that follow after the other blocks' writes
  return last;
}

// Waits until `total` blocks have called it on `counter` (their writes before it are then visible
// to every thread of this block). All `total` blocks must be resident at once; the counter stays
// at `total` until the caller re-arms it, once every block is known to be past the wait.
__device__ inline void arrive_and_wait(int* counter, int total) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1);
    while (load_polled(counter) < total) {
    }
    __threadfence();
  }
  __syncthreads();
}

}  // namespace revolta::cuda
