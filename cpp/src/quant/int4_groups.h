// 4-bit integer weights with a scale and a zero point per group of 32 or 128 values along a row
// (DType::kI4G32 / kI4G128): AWQ's format, repacked at load from its on-disk layout (AutoAWQ
// GEMM: qweight int32 [K, N / 8], qzeros int32 [K / group, N / 8], scales f16 [K / group, N])
// into row-major blocks, so a row slices, stacks and streams like any other weight.
//
// A block holds four groups: their four headers (scale f16, zero point f16: an integer 0..15),
// 16 bytes, then the groups' values, group / 8 little-endian 32-bit words each, a word holding 8
// consecutive values of the row. Blocks of 80 / 272 bytes keep every 16 bytes of values 16-byte
// aligned, so a GPU lane loads 32 values at once. Value j of a word sits at bits 4 * kInt4Slot[j],
// AWQ's own order, so that (word >> 4i) & 0x000F000F holds values 2i and 2i + 1 in its two halves
// (a kernel makes a half2 of them with one logic op). x = (q - zero) scale. Rows must be a whole
// number of blocks (K a multiple of 4 groups); the loader keeps other AWQ matrices dequantized.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace revolta {

inline constexpr int kInt4Slot[8] = {0, 4, 1, 5, 2, 6, 3, 7};
inline constexpr int kInt4GroupsPerBlock = 4;

// The block type of a group size (32 or 128); throws std::invalid_argument naming `what` otherwise.
DType int4_group_dtype(int64_t group, const char* what);
// Values per scale and zero point of a 4-bit block type.
inline int64_t int4_group_size(DType t) { return dtype_block_values(t) / kInt4GroupsPerBlock; }
// One block of type t to float32.
void dequantize_int4_block(DType t, const uint8_t* block, float* out);
// AutoAWQ GEMM tensors of a [N, K] linear weight (K a multiple of 4 groups) to N rows of blocks
// (out: N * dtype_bytes(t, K)).
void repack_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t N, int64_t K,
                int64_t group, uint8_t* out);
// The same tensors as the float [N, K] weight they stand for (the published dequantization).
void dequantize_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t N, int64_t K,
                    int64_t group, float* out);
// Random blocks for load_format dummy: values (q - 8) * scale with scale = bound / 8.
void fill_int4_dummy(DType t, int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out);

}  // namespace revolta
