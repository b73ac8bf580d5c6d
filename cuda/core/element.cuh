// Element conversions the kernels share: f32 / f16 storage, f32 arithmetic.
#pragma once

#include <cuda_fp16.h>

namespace revolta::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ __half to_half(float v) { return __float2half_rn(v); }
__device__ __forceinline__ __half to_half(__half v) { return v; }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
// v as an element of type C holds it (f16: rounded to nearest), back in f32.
template <typename C>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (sizeof(C) == 2) return __half2float(__float2half_rn(v));
  else return v;
}

// Two float4s as eight floats.
__device__ __forceinline__ void split8(float4 a, float4 b, float (&w)[8]) {
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

// Eight consecutive elements as floats through one or two 16-byte read-only loads (p 16-byte aligned).
// Read-only for the kernel's whole life: weights and tables, never what an earlier kernel of the
// step writes (load8_input): the compiler takes these loads for invariant and may hoist them above
// wait_for_predecessor().
__device__ __forceinline__ void load8(const float* p, float (&w)[8]) {
  split8(__ldg(reinterpret_cast<const float4*>(p)), __ldg(reinterpret_cast<const float4*>(p) + 1), w);
}

// Loads of what an earlier kernel wrote (activations), made after wait_for_predecessor(): volatile
// asm keeps them after the wait. (With __ldg, the whole-row GEMV's loads of x were hoisted above it
// and read x while the kernel before it was still writing it.) Plain global loads, L1 allowed.
__device__ __forceinline__ float4 load_input4(const float* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ float load_input(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void load8_input(const float* p, float (&w)[8]) {
  split8(load_input4(p), load_input4(p + 4), w);
}

// raw by value: taken by reference from a dereferenced global pointer, the element reads below
// became eight 2-byte loads in place of one 16-byte load (decode attention read its KV cache at a
// tenth of the bandwidth so).
__device__ __forceinline__ void unpack8(const uint4 raw, float (&w)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    w[2 * i] = f.x, w[2 * i + 1] = f.y;
  }
}

// Weight rows are read once a step: streaming loads (evict first, in L1 and L2) leave the caches
// to what a step reads again (activations, partial rows, address tables, the kernels' code),
// which the weights streaming past would otherwise push out to DRAM.
// (Inline PTX, not __ldcs: clang's CUDA headers, which the SM70 lane builds with, have no vector
// overloads of it.)

// Eight halves as one raw 16-byte load, converted only when used (unpack8 / dot8): half the
// registers of floats, so a lane can keep twice as many loads in flight.
__device__ __forceinline__ uint4 load_weight_raw8(const __half* p) {
  uint4 v;
  asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ float4 load_weight_f4(const float* p) {
  float4 v;
  asm("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ void load_weight8(const float* p, float (&w)[8]) {
  split8(load_weight_f4(p), load_weight_f4(p + 4), w);
}

__device__ __forceinline__ void load_weight8(const __half* p, float (&w)[8]) { unpack8(load_weight_raw8(p), w); }

// Weights a later kernel of the step reads, pulled into L2 while this one leaves the memory idle
// (a hint: results do not depend on it): chunk i * stride (kWarmChunk bytes each) of base for i in
// [0, chunks), thread `thread` of `threads` taking every threads-th. The prefetched lines keep the
// normal eviction priority, so the streaming loads between here and their use (evict first) do
// not push them out. sm_90's bulk prefetch takes a chunk in one instruction; other devices skip
// it (a V100's 6 MB L2 would not keep them past the experts' stream).
constexpr int kWarmChunk = 1024;
__device__ __forceinline__ void warm_l2(const char* base, int chunks, int stride, int thread, int threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = thread; i < chunks; i += threads) {
    const size_t at = __cvta_generic_to_global(base + size_t(i) * size_t(stride) * kWarmChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "n"(kWarmChunk) : "memory");
  }
#endif
}

// Each half pair converted as it is used (not all eight first): the order the slice kernels were
// measured with.
__device__ __forceinline__ float dot8(const uint4& raw, const float (&x)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    s += f.x * x[2 * i] + f.y * x[2 * i + 1];
  }
  return s;
}

// y[0, 8) += a * (eight halves).
__device__ __forceinline__ void axpy8(float a, const uint4& raw, float (&y)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    y[2 * i] += a * f.x, y[2 * i + 1] += a * f.y;
  }
}

}  // namespace revolta::cuda
