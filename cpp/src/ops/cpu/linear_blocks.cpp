// The CPU linear layer over weights kept in 32-value blocks (Q4_0, Q4_1, Q8_0; Q4_K's sub-blocks) with integer dot
// products: each input row is quantized once to 8-bit blocks (a scale per 32 values, plus the
// block's sum for Q4_1's minimum), then every weight block meets its input block in
// 32 int8 x int8 products summed in int32 (AVX2 maddubs / madd), scaled by both blocks' scales.
// The weights are read once, as stored, and never widened to float.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {
namespace {

#if RV_AVX2

constexpr int64_t kBlock = 32;

// An input row in 8-bit blocks.
struct QuantizedRow {
  std::vector<int8_t> q;      // K values
  std::vector<float> scale;   // K / 32 scales: x ~ q * scale
  // K / 32 sums of each block's quantized values (times its scale): Q4_1's minimum must meet the
  // same x as its values, or their errors stop cancelling (the exact float sum tripled the error
  // of SmolLM2's projections: 2.4% against 0.7%).
  std::vector<float> sum;
};

void quantize_row(const float* x, int64_t K, QuantizedRow& r) {
  r.q.resize(size_t(K));
  r.scale.resize(size_t(K / kBlock));
  r.sum.resize(size_t(K / kBlock));
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* v = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      const int8_t q = int8_t(std::lrintf(v[j] * inv));
      r.q[size_t(b * kBlock + j)] = q;
      sum += q;
    }
    r.scale[size_t(b)] = d;
    r.sum[size_t(b)] = d * float(sum);
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // F16C
}

// The sum over 32 lanes of u * x (u unsigned bytes, x signed bytes), as 8 int32 lanes in float: one
// VNNI instruction where the build machine has AVX-VNNI, else maddubs (16-bit pairs, no overflow
// for u <= 255, |x| <= 127 over two lanes) then madd.
inline __m256 dot32_unsigned(__m256i u, __m256i x) {
#if defined(__AVXVNNI__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x));
#else
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

// The sum over 32 lanes of w * x (w and x signed bytes, |w| <= 127): |w| times x with w's sign.
inline __m256 dot32(__m256i w, __m256i x) { return dot32_unsigned(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)); }

// 16 bytes of nibbles as 32 bytes: low nibbles (values 0..15 of the block) then high (16..31).
inline __m256i unpack_nibbles(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Q4_K's 6-bit scale and minimum of sub-block i (quant/gguf_blocks.cpp has the layout).
inline void k_scale_min(const uint8_t* s, int i, int& scale, int& minimum) {
  if (i < 4) {
    scale = s[i] & 63, minimum = s[i + 4] & 63;
  } else {
    scale = (s[i + 4] & 0xF) | ((s[i - 4] >> 6) << 4), minimum = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
  }
}

// Q4_K rows: 256-value super-blocks of eight 32-value sub-blocks, each 32 bytes of nibbles holding
// two sub-blocks (low nibbles the first); x = d scale q - dmin minimum, so a sub-block meets its
// input block as Q4_1 does, with d scale and -dmin minimum.
template <int R>
void row_dots_q4_k(const uint8_t* w, const QuantizedRow* const* x, int64_t blocks, float* out) {
  __m256 acc[R];
  float minimums[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), minimums[r] = 0.0f;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; b += 8, w += 144) {
    const float d = half_at(w), dmin = half_at(w + 2);
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * pair));
      const __m256i halves[2] = {_mm256_and_si256(bytes, mask), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask)};
      for (int h = 0; h < 2; ++h) {
        int sc, mn;
        k_scale_min(w + 4, 2 * pair + h, sc, mn);
        const int64_t xb = b + 2 * pair + h;
        for (int r = 0; r < R; ++r) {
          const __m256 s = dot32_unsigned(halves[h], load32(x[r]->q.data() + xb * kBlock));
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * float(sc) * x[r]->scale[size_t(xb)]), s, acc[r]);
          minimums[r] -= dmin * float(mn) * x[r]->sum[size_t(xb)];
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + minimums[r];
}

// One weight row (K / 32 blocks) against R quantized input rows: each weight block is unpacked
// once and meets the R input blocks while it is in registers.
template <int R>
void row_dots(DType t, const uint8_t* w, const QuantizedRow* const* x, int64_t blocks, float* out) {
  if (t == DType::kQ4_K) return row_dots_q4_k<R>(w, x, blocks, out);
  __m256 acc[R];
  float minimums[R];  // Q4_1: sums over blocks of m * sum(x)
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), minimums[r] = 0.0f;
  const int64_t bytes = dtype_bytes(t, kBlock);
  for (int64_t b = 0; b < blocks; ++b, w += bytes) {
    const float d = half_at(w);
    __m256i wq;
    if (t == DType::kQ8_0) wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    else if (t == DType::kQ4_0) wq = _mm256_sub_epi8(unpack_nibbles(w + 2), _mm256_set1_epi8(8));
    else wq = unpack_nibbles(w + 4);  // Q4_1: unsigned, its minimum apart
    const float m = t == DType::kQ4_1 ? half_at(w + 2) : 0.0f;
    for (int r = 0; r < R; ++r) {
      const __m256i xq = load32(x[r]->q.data() + b * kBlock);
      const __m256 s = t == DType::kQ4_1 ? dot32_unsigned(wq, xq) : dot32(wq, xq);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[r]->scale[size_t(b)]), s, acc[r]);
      minimums[r] += m * x[r]->sum[size_t(b)];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + minimums[r];
}

#endif

}  // namespace

bool linear_blocks_int8(const float* x, int64_t M, int64_t K, const Tensor& w, int64_t N, float* out) {
#if RV_AVX2
  const DType t = w.dtype();
  if ((t != DType::kQ8_0 && t != DType::kQ4_0 && t != DType::kQ4_1 && t != DType::kQ4_K) || K % dtype_block_values(t))
    return false;
  // Reused by the calling thread (the workers see it through this reference, not their own copy).
  thread_local std::vector<QuantizedRow> buffers;
  std::vector<QuantizedRow>& rows = buffers;
  rows.resize(size_t(M));
  for (int64_t m = 0; m < M; ++m) quantize_row(x + m * K, K, rows[size_t(m)]);
  const int64_t row_bytes = dtype_bytes(t, K), blocks = K / kBlock, per_task = 16;
  const auto* base = static_cast<const uint8_t*>(w.data());
  parallel_tasks((N + per_task - 1) / per_task, [&](int64_t task) {
    const int64_t n1 = std::min(N, (task + 1) * per_task);
    for (int64_t n = task * per_task; n < n1; ++n)
      for (int64_t m = 0; m < M; m += 4) {  // input rows four at a time
        const QuantizedRow* x4[4];
        float dots[4];
        const int r = int(std::min<int64_t>(4, M - m));
        for (int i = 0; i < r; ++i) x4[i] = &rows[size_t(m + i)];
        const uint8_t* wr = base + n * row_bytes;
        if (r == 4) row_dots<4>(t, wr, x4, blocks, dots);
        else if (r == 3) row_dots<3>(t, wr, x4, blocks, dots);
        else if (r == 2) row_dots<2>(t, wr, x4, blocks, dots);
        else row_dots<1>(t, wr, x4, blocks, dots);
        for (int i = 0; i < r; ++i) out[(m + i) * N + n] = dots[i];
      }
  });
  return true;
#else
  (void)x, (void)M, (void)K, (void)w, (void)N, (void)out;
  return false;
#endif
}

}  // namespace revolta::ops::cpu
