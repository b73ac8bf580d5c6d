// 4-bit integer weights with a scale and a zero point per group of 32 or 128 values along a row
// (DType::kI4G32 / kI4G128): AWQ's format, repacked at load from its on-disk layout (AutoAWQ
// GEMM: qweight int32 [K, N / 8], qzeros int32 [K / group, N / 8], scales f16 [K / group, N])
// into row-major blocks, so a row slices, stacks and streams like any other weight.
//
// A block: scale (f16), zero point (f16, an integer 0..15), then group / 8 little-endian 32-bit
// words, each holding 8 consecutive values of the row; value j of a word sits at bits
// 4 * kInt4Slot[j], AWQ's own order, so that (word >> 4i) & 0x000F000F holds values 2i and 2i + 1
// in its two halves (a kernel turns them into a half2 with one logic op). x = (q - zero) scale.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace revolta {

inline constexpr int kInt4Slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// The block type of a group size (32 or 128); throws std::invalid_argument naming `what` otherwise.
DType int4_group_dtype(int64_t group, const char* what);
// One block of type t to float32.
void dequantize_int4_block(DType t, const uint8_t* block, float* out);
// AutoAWQ GEMM tensors of a [N, K] linear weight to N rows of blocks (out: N * dtype_bytes(t, K)).
void repack_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t N, int64_t K,
                int64_t group, uint8_t* out);
// Random blocks for load_format dummy: values (q - 8) * scale with scale = bound / 8.
void fill_int4_dummy(DType t, int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out);

}  // namespace revolta
