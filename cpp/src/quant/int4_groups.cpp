#include "quant/int4_groups.h"

#include <cstring>
#include <stdexcept>

#include "core/error.h"

namespace revolta {
namespace {

// AutoAWQ packs 8 output columns per int32: column j of a run of 8 at bits 4 * kInt4Slot[j].
uint32_t awq_nibble(const int32_t* packed, int64_t row, int64_t cols8, int64_t n) {
  return (uint32_t(packed[row * cols8 + n / 8]) >> (4 * kInt4Slot[n % 8])) & 0xFu;
}

}  // namespace

DType int4_group_dtype(int64_t group, const char* what) {
  if (group == 32) return DType::kI4G32;
  if (group == 128) return DType::kI4G128;
  throw std::invalid_argument(str_cat(what, ": group size ", group, " is not supported (4-bit weights: 32 or 128)"));
}

void dequantize_int4_block(DType t, const uint8_t* b, float* y) {
  const int64_t group = int4_group_size(t);
  for (int g = 0; g < kInt4GroupsPerBlock; ++g) {
    uint16_t h[2];
    std::memcpy(h, b + 4 * g, 4);
    const float scale = f16_to_f32(h[0]), zero = f16_to_f32(h[1]);
    const uint8_t* words = b + 16 + g * group / 2;
    for (int64_t w = 0; w < group / 8; ++w) {
      uint32_t word;
      std::memcpy(&word, words + 4 * w, 4);
      for (int j = 0; j < 8; ++j) y[g * group + w * 8 + j] = (float((word >> (4 * kInt4Slot[j])) & 0xFu) - zero) * scale;
    }
  }
}

void repack_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t N, int64_t K,
                int64_t group, uint8_t* out) {
  const DType t = int4_group_dtype(group, "AWQ weights");
  const int64_t block_values = dtype_block_values(t), block_bytes = dtype_bytes(t, block_values), cols8 = N / 8;
  RV_CHECK(N % 8 == 0 && K % block_values == 0, "AWQ weights: [", N, ", ", K, "] is not a whole number of packed columns and ",
           block_values, "-value blocks");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < K / group; ++g) {
      uint8_t* b = out + (n * (K / block_values) + g / kInt4GroupsPerBlock) * block_bytes;
      const int64_t slot = g % kInt4GroupsPerBlock;
      const uint16_t h[2] = {scales[g * N + n], f32_to_f16(float(awq_nibble(qzeros, g, cols8, n)))};
      std::memcpy(b + 4 * slot, h, 4);
      for (int64_t w = 0; w < group / 8; ++w) {
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) word |= awq_nibble(qweight, g * group + w * 8 + j, cols8, n) << (4 * kInt4Slot[j]);
        std::memcpy(b + 16 + slot * group / 2 + 4 * w, &word, 4);
      }
    }
}

void dequantize_awq(const int32_t* qweight, const int32_t* qzeros, const uint16_t* scales, int64_t N, int64_t K,
                    int64_t group, float* out) {
  const int64_t cols8 = N / 8;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / group;
      out[n * K + k] = (float(awq_nibble(qweight, k, cols8, n)) - float(awq_nibble(qzeros, g, cols8, n))) *
                       f16_to_f32(scales[g * N + n]);
    }
}

void fill_int4_dummy(DType t, int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out) {
  const int64_t values = dtype_block_values(t), blocks = rows * (cols / values), block_bytes = dtype_bytes(t, values);
  const uint16_t h[2] = {f32_to_f16(bound / 8.0f), f32_to_f16(8.0f)};
  uint64_t s = seed | 1;
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = out + i * block_bytes;
    for (int g = 0; g < kInt4GroupsPerBlock; ++g) std::memcpy(b + 4 * g, h, 4);
    for (int64_t at = 16; at < block_bytes; at += 8) {  // xorshift64: 16 nibbles a draw
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      std::memcpy(b + at, &s, 8);
    }
  }
}

}  // namespace revolta
