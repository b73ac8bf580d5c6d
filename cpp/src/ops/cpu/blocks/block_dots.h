// The integer-dot kernels of the CPU block linear (ops/cpu/linear_blocks.cpp), built once per x86
// instruction set (block_dots_*.cpp, each with its own compiler flags) and picked at run time by
// what the processor reports, so one build runs on any x86-64 machine and uses VNNI where present.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace revolta::ops::cpu {

// An input row quantized to 8-bit blocks of 32: x ~ q * scale[b], or with the residual plane lo
// (16-bit activations) x ~ (254 q + lo) * scale[b] (scale then 254 times smaller); sum[b] is the block's quantized values
// summed, times its scale (Q4_1's and Q4_K's minimums meet it). Every row of a call has lo or none does.
struct BlockRow {
  const int8_t* q;
  const int8_t* lo;  // null: 8-bit activations
  const float* scale;
  const float* sum;
};

// One weight row of `blocks` 32-value blocks of type t (Q8_0, Q4_0, Q4_1; Q4_K, Q5_K, Q6_K: blocks a
// multiple of 8) against r input rows (1..4): out[i] = the row's dot with x[i].
using BlockDots = void (*)(DType t, const uint8_t* w, const BlockRow* x, int r, int64_t blocks, float* out);

struct BlockKernels {
  const char* isa;  // "avx2", "avx-vnni", "avx512-vnni", or "none" (no integer-dot kernels)
  BlockDots dots;   // null with "none"
};

// The variant for this processor, chosen once; REVOLTA_CPU_ISA (avx2 | avx-vnni | avx512-vnni |
// none) asks for a lower one (a variant the processor lacks is refused with an error).
const BlockKernels& block_kernels();

#if defined(__x86_64__)
void block_dots_avx2(DType t, const uint8_t* w, const BlockRow* x, int r, int64_t blocks, float* out);
void block_dots_avxvnni(DType t, const uint8_t* w, const BlockRow* x, int r, int64_t blocks, float* out);
void block_dots_avx512vnni(DType t, const uint8_t* w, const BlockRow* x, int r, int64_t blocks, float* out);
#endif

}  // namespace revolta::ops::cpu
