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

// Where value k of a row lies (k % 8 == 0): the word holding values k..k+7 and its group's header.
// G, the group size, is a template argument so that the block arithmetic is shifts.
template <int G>
struct Int4Block {
  static constexpr int kValues = 4 * G, kBytes = 16 + 2 * G;  // quant/int4_groups.h
  static __device__ __forceinline__ const uint8_t* block(const uint8_t* row, int k) {
    return row + size_t(k / kValues) * kBytes;
  }
  static __device__ __forceinline__ uint32_t head(const uint8_t* row, int k) {
    return load_word(block(row, k) + 4 * ((k % kValues) / G));
  }
  static __device__ __forceinline__ uint32_t word(const uint8_t* row, int k) {
    return load_word(block(row, k) + 16 + (k % kValues) / 2);
  }
};

// Where value k of a row lies, for a group size known only at run time (the dequantizing kernels).
struct Int4Row {
  const uint8_t* row;
  int group, block_bytes;
  __device__ __forceinline__ const uint8_t* block(int k) const { return row + size_t(k / (4 * group)) * block_bytes; }
  __device__ __forceinline__ uint32_t head(int k) const { return load_word(block(k) + 4 * ((k % (4 * group)) / group)); }
  __device__ __forceinline__ uint32_t word(int k) const { return load_word(block(k) + 16 + (k % (4 * group)) / 2); }
};

// The words and headers of R rows for U steps of 256 values from k (a lane's word of each), zeros
// past K: what a lane loads at once.
template <int G, int R, int U>
__device__ __forceinline__ void int4_load_steps(const uint8_t* const (&rows)[R], int k, int K, uint32_t (&head)[U][R],
                                                uint32_t (&word)[U][R]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int kk = k + u * 32 * 8;
      head[u][r] = kk < K ? Int4Block<G>::head(rows[r], kk) : 0u;
      word[u][r] = kk < K ? Int4Block<G>::word(rows[r], kk) : 0u;
    }
}

// A warp's dots of R rows (row r's blocks from rows[r]), K values each (K a multiple of 8), summed
// over the warp into every lane: a lane takes one word of each row per 256 values, the words and
// headers of U such steps loaded at once, then used. x8(r, k, xv) gives row r's 8 inputs at k
// (from shared memory: a load from global memory per row and word would wait a round trip each);
// ready() runs once, after the first words are on their way (a block stages its inputs there).
// Small R x U: the loaded words stay in registers (the arrays of 12 rows spilled to the stack).
template <int G, int R, int U, typename X8, typename Ready>
__device__ __forceinline__ void int4_warp_dots(const uint8_t* const (&rows)[R], X8 x8, Ready ready, int K, int lane,
                                               float (&out)[R]) {
  constexpr int kStep = 32 * 8;
  uint32_t head[U][R], word[U][R];
  auto load = [&](int k) { int4_load_steps<G, R, U>(rows, k, K, head, word); };
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.0f;
  const int k0 = lane * 8;
  load(k0);
  ready();
  for (int k = k0; k < K; k += U * kStep) {
    if (k != k0) load(k);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * kStep;
      if (kk >= K) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xv[8];
        x8(r, kk, xv);
        out[r] += int4_word_dot(word[u][r], head[u][r], xv);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = warp_sum(out[r]);
}

// Eight floats of shared memory (p 16-byte aligned).
__device__ __forceinline__ void shared8(const float* p, float (&v)[8]) {
  split8(*reinterpret_cast<const float4*>(p), *reinterpret_cast<const float4*>(p + 4), v);
}

// n floats (a multiple of 4, 16-byte aligned) of what an earlier kernel wrote into shared memory, by
// the whole block, which then synchronises.
__device__ __forceinline__ void stage_inputs(const float* src, float* dst, int n) {
  for (int c = threadIdx.x * 4; c < n; c += blockDim.x * 4) *reinterpret_cast<float4*>(dst + c) = load_input4(src + c);
  __syncthreads();
}

}  // namespace revolta::cuda
