// Reading 4-bit group blocks (DType::kI4G32 / kI4G128, quant/int4_groups.h) on SM70: a word holds
// 8 values of a row, its group's header (scale f16, zero point f16) sits at the head of the block.
// A word's values become four half2 of (1024 + q) with one logic op each (the nibbles of values
// 2i and 2i + 1 sit at bits 4i and 16 + 4i: OR-ing in the exponent of 1024 makes halves of them);
// subtracting 1024 + zero is exact in fp16, and the products accumulate in fp32, so large
// activations cannot overflow an fp16 sum.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "core/element.cuh"
#include "core/warp_reduce.cuh"

namespace revolta::cuda {

__device__ __forceinline__ uint32_t load_word(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// The values 2i and 2i + 1 of a word, minus the zero point (zz = 1024 + zero in both halves).
__device__ __forceinline__ float2 int4_pair(uint32_t word, int i, __half2 zz) {
  const uint32_t bits = ((word >> (4 * i)) & 0x000F000Fu) | 0x64006400u;
  return __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&bits), zz));
}

// sum_j x[j] (q_j - zero) scale over the 8 values of `word`, whose group header is `head`.
__device__ __forceinline__ float int4_word_dot(uint32_t word, uint32_t head, const float (&x)[8]) {
  const __half2 zz = __half2half2(__hadd(__ushort_as_half(uint16_t(head >> 16)), __float2half(1024.0f)));
  const float scale = __half2float(__ushort_as_half(uint16_t(head & 0xFFFFu)));
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 v = int4_pair(word, j, zz);
    dot += v.x * x[2 * j] + v.y * x[2 * j + 1];
  }
  return scale * dot;
}

// The 8 values of `word` as f16 (q - zero) scale.
__device__ __forceinline__ uint4 int4_word_halves(uint32_t word, uint32_t head) {
  const __half2 scale = __half2half2(__ushort_as_half(uint16_t(head & 0xFFFFu)));
  const __half2 zz = __half2half2(__hadd(__ushort_as_half(uint16_t(head >> 16)), __float2half(1024.0f)));
  uint4 out;
  uint32_t* v = &out.x;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t bits = ((word >> (4 * j)) & 0x000F000Fu) | 0x64006400u;
    const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&bits), zz), scale);
    v[j] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return out;
}

// Where value k of a row lies: the word (8 values from k, k % 8 == 0) and its group's header.
struct Int4Row {
  const uint8_t* row;
  int group, block_bytes;
  __device__ __forceinline__ const uint8_t* block(int k) const { return row + size_t(k / (4 * group)) * block_bytes; }
  __device__ __forceinline__ uint32_t head(int k) const { return load_word(block(k) + 4 * ((k % (4 * group)) / group)); }
  __device__ __forceinline__ uint32_t word(int k) const { return load_word(block(k) + 16 + (k % (4 * group)) / 2); }
};

// A warp's dots of R rows with R inputs (row r against x[r], K values each, K a multiple of 8),
// summed over the warp into every lane: a lane takes one word of each row per 256 values, the words
// and headers of U such steps loaded before any is used and the next U steps' while they are.
template <int R, int U>
__device__ __forceinline__ void int4_warp_dots(const Int4Row (&rows)[R], const float* const (&x)[R], int K, int lane,
                                               float (&out)[R]) {
  constexpr int kStep = 32 * 8;
  uint32_t head[U][R], word[U][R];
  auto load = [&](int k) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int kk = k + u * kStep;
        head[u][r] = kk < K ? rows[r].head(kk) : 0u;
        word[u][r] = kk < K ? rows[r].word(kk) : 0u;
      }
  };
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.0f;
  int k = lane * 8;
  load(k);
  for (; k < K; k += U * kStep) {
    uint32_t h[U][R], q[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) h[u][r] = head[u][r], q[u][r] = word[u][r];
    if (k + U * kStep < K) load(k + U * kStep);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * kStep;
      if (kk >= K) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xv[8];
        load8_input(x[r] + kk, xv);
        out[r] += int4_word_dot(q[u][r], h[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = warp_sum(out[r]);
}

}  // namespace revolta::cuda
