// Vector helpers for the CPU ops: 8-wide float lanes on AVX2/FMA/F16C machines, plain scalar
// loops elsewhere. Weight loads convert f16/bf16 to float in registers.
#pragma once

#include <cstdint>

#include "core/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define RV_AVX2 1
#include <immintrin.h>
#else
#define RV_AVX2 0
#endif

namespace revolta::ops::cpu {

// Weight element tags, so kernels can be instantiated per storage type.
struct F32W {
  using T = float;
  static float scalar(const T* p) { return *p; }
};
struct F16W {
  using T = uint16_t;
  static float scalar(const T* p) { return f16_to_f32(*p); }
};
struct BF16W {
  using T = uint16_t;
  static float scalar(const T* p) { return bf16_to_f32(*p); }
};

#if RV_AVX2
constexpr int kLanes = 8;
// Accumulator lanes. __m256 is declared may_alias, so GCC keeps arrays of it in memory when any
// float is loaded in the same loop; this plain vector type lets the accumulators live in registers.
typedef float vacc __attribute__((vector_size(32)));
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(F32W, const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(F16W, const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(BF16W, const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
#else
constexpr int kLanes = 1;
#endif

inline float dot_f32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if RV_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(load8(a + i + 8), load8(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(a + i), load8(b + i), acc0);
  s = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy_f32(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if RV_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load8(x + i), load8(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace revolta::ops::cpu
