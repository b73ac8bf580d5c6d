// KV cache elements as the attention kernels read and write them: float32, float16, E4M3 bytes
// (one scale per layer for K and for V) and int8 (one scale per slot and KV head), as ops::KvQuant
// defines them. No FP8 hardware is assumed (SM70): E4M3 turns into float16 by moving its bits
// (sign to bit 15, exponent and mantissa to bits 13..7), which gives the value times 2^-8 exactly
// (normals and subnormals alike); the 2^8 goes into the scale the kernel applies anyway.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/element.cuh"
#include "core/warp_reduce.cuh"
#include "ops/ops.h"

namespace revolta::cuda {

struct Fp8 {  // an E4M3 cache element
  uint8_t bits;
};

template <typename C>
constexpr bool kScaledRows = std::is_same_v<C, int8_t>;  // a scale per (slot, KV head)
template <typename C>
constexpr bool kQuantized = std::is_same_v<C, Fp8> || std::is_same_v<C, int8_t>;

// What a kernel multiplies the raw values it reads by (raw: to_raw below): for E4M3 its layer
// scale times 2^8; int8 rows carry their own (rows[slot * kv_heads + head]); 1 otherwise.
struct KvScales {
  float k = 1.0f, v = 1.0f;
  const float* k_rows = nullptr;
  const float* v_rows = nullptr;
};

template <typename C>
KvScales kv_scales(const ops::KvQuant* q) {
  if (!q) return {};
  if constexpr (kScaledRows<C>) return {1.0f, 1.0f, q->k_rows.ptr<float>(), q->v_rows.ptr<float>()};  // no layer scale
  const float unit = std::is_same_v<C, Fp8> ? 256.0f : 1.0f;
  return {q->k * unit, q->v * unit};
}

// Two E4M3 bytes (the low 16 bits of w) as two float16 values 2^-8 times theirs.
__device__ __forceinline__ float2 fp8x2_raw(uint32_t w) {
  const uint32_t t = __byte_perm(w, 0, 0x1404);  // byte 0 to bits 8..15, byte 1 to bits 24..31
  const uint32_t h = (t & 0x80008000u) | ((t & 0x7f007f00u) >> 1);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

__device__ __forceinline__ float to_raw(float v) { return v; }
__device__ __forceinline__ float to_raw(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_raw(int8_t v) { return float(v); }
__device__ __forceinline__ float to_raw(Fp8 v) { return fp8x2_raw(v.bits).x; }

// 16 bytes of cache elements as raw floats (16 / sizeof(C) of them).
template <typename C>
__device__ __forceinline__ void unpack_raw(const uint4 raw, float* v) {
  if constexpr (std::is_same_v<C, Fp8>) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 a = fp8x2_raw(w[i]), b = fp8x2_raw(w[i] >> 16);
      v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = b.x, v[4 * i + 3] = b.y;
    }
  } else {
    const C* e = reinterpret_cast<const C*>(&raw);
#pragma unroll
    for (int k = 0; k < int(16 / sizeof(C)); ++k) v[k] = to_raw(e[k]);
  }
}

// f to E4M3 as the CPU's f32_to_f8e4m3 rounds it: nearest even, saturating at 448.
__device__ __forceinline__ uint8_t to_e4m3(float f) {
  if (isnan(f)) return 0x7f;
  const uint8_t sign = signbit(f) ? 0x80 : 0;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) return sign | uint8_t(__float2int_rn(a * 512.0f));  // subnormal steps of 2^-9
  int e = 0;
  const float fr = frexpf(a, &e);
  int q = __float2int_rn(fr * 16.0f), exp = e - 1 + 7;
  if (q == 16) q = 8, ++exp;
  return uint8_t(sign | exp << 3 | (q - 8));
}

// A warp writes one cache row of D values (src: in global or shared memory) as the cache holds
// them; inv_scale is 1 / the E4M3 layer scale; row_scale receives an int8 row's scale.
template <typename C>
__device__ __forceinline__ void store_row_warp(C* dst, float* row_scale, const float* src, int D, float inv_scale) {
  const int lane = int(threadIdx.x % 32);
  if constexpr (std::is_same_v<C, Fp8>) {
    for (int d = lane; d < D; d += 32) dst[d].bits = to_e4m3(src[d] * inv_scale);
  } else if constexpr (std::is_same_v<C, int8_t>) {
    float amax = 0.0f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(src[d]));
    amax = warp_max(amax);
    const float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int d = lane; d < D; d += 32) dst[d] = int8_t(fminf(fmaxf(rintf(src[d] * inv), -127.0f), 127.0f));
    if (lane == 0) *row_scale = s;
  } else {
    for (int d = lane; d < D; d += 32) store(dst + d, src[d]);
  }
}

}  // namespace revolta::cuda
