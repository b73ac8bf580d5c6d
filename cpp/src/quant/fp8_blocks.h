// FP8 E4M3 weights with a float32 scale per 128 values along a row (DType::kF8G128): the engine's
// layout for checkpoints that store `weight` as F8_E4M3 with its scales beside it, per tensor, per
// output channel or per 128 x 128 block (HF's `fp8` weight_scale_inv, compressed-tensors'
// weight_scale). A block: the scale (f32), then 128 E4M3 bytes; x = e4m3(v) * scale. Each block
// carries the scale that covers it, so all three layouts become one, and rows slice as usual.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace revolta {

inline constexpr int64_t kF8Block = 128;

// One block to float32.
void dequantize_f8_block(const uint8_t* block, float* out);
// A [N, K] E4M3 matrix and its scales (float32: 1 value, N values, or ceil(N / 128) x ceil(K / 128)
// blocks; `scales_shape` says which) to N rows of blocks (K a multiple of 128), or, with out_f32,
// to the float [N, K] matrix it stands for (any K).
void pack_f8(const uint8_t* w, const float* scales, int64_t scale_rows, int64_t scale_cols, int64_t N, int64_t K,
             uint8_t* out_blocks, float* out_f32);
// Random blocks for load_format dummy: values within +-bound, no NaN codes.
void fill_f8_dummy(int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out);

// NVFP4 (ModelOpt): FP4 E2M1 values, two a byte (the first in the low nibble), an E4M3 scale per 16
// and a float32 scale per tensor; x = e2m1(v) * e4m3(scale) * global. The engine's block
// (DType::kNVFP4) holds 64 values: the global scale (f32), the four E4M3 scales, 32 bytes of values.
inline constexpr int64_t kNvfp4Block = 64, kNvfp4Group = 16;
float e2m1_to_f32(uint8_t nibble);
void dequantize_nvfp4_block(const uint8_t* block, float* out);
// A [N, K] matrix stored as ModelOpt does (values [N, K / 2], scales E4M3 [N, K / 16], the global
// scale) to N rows of blocks (K a multiple of 64), or with out_f32 to the float [N, K] matrix.
void pack_nvfp4(const uint8_t* values, const uint8_t* scales, float global, int64_t N, int64_t K, uint8_t* out_blocks,
                float* out_f32);
void fill_nvfp4_dummy(int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out);

}  // namespace revolta
