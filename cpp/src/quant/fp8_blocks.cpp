#include "quant/fp8_blocks.h"

#include <cstring>

#include "core/error.h"

namespace revolta {

void dequantize_f8_block(const uint8_t* b, float* y) {
  float scale;
  std::memcpy(&scale, b, 4);
  for (int64_t i = 0; i < kF8Block; ++i) y[i] = f8e4m3_to_f32(b[4 + i]) * scale;
}

void pack_f8(const uint8_t* w, const float* scales, int64_t scale_rows, int64_t scale_cols, int64_t N, int64_t K,
             uint8_t* out_blocks, float* out_f32) {
  const bool per_tensor = scale_rows * scale_cols == 1, per_channel = !per_tensor && scale_rows == N && scale_cols == 1;
  RV_CHECK(per_tensor || per_channel ||
               (scale_rows == (N + kF8Block - 1) / kF8Block && scale_cols == (K + kF8Block - 1) / kF8Block),
           "FP8 weight [", N, ", ", K, "]: scales [", scale_rows, ", ", scale_cols,
           "] are neither per tensor, per output channel nor per 128 x 128 block");
  auto scale = [&](int64_t n, int64_t k) {
    return per_tensor ? scales[0] : per_channel ? scales[n] : scales[(n / kF8Block) * scale_cols + k / kF8Block];
  };
  if (out_f32) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) out_f32[n * K + k] = f8e4m3_to_f32(w[n * K + k]) * scale(n, k);
    return;
  }
  RV_CHECK(K % kF8Block == 0, "FP8 blocks: K = ", K, " is not a multiple of ", kF8Block);
  const int64_t block_bytes = dtype_bytes(DType::kF8G128, kF8Block);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kb = 0; kb < K / kF8Block; ++kb) {
      uint8_t* b = out_blocks + (n * (K / kF8Block) + kb) * block_bytes;
      const float s = scale(n, kb * kF8Block);
      std::memcpy(b, &s, 4);
      std::memcpy(b + 4, w + n * K + kb * kF8Block, size_t(kF8Block));
    }
}

void fill_f8_dummy(int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out) {
  const int64_t blocks = rows * (cols / kF8Block), block_bytes = dtype_bytes(DType::kF8G128, kF8Block);
  const float scale = bound / 448.0f;
  uint64_t s = seed | 1;
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = out + i * block_bytes;
    std::memcpy(b, &scale, 4);
    for (int64_t j = 0; j < kF8Block; ++j) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      const uint8_t v = uint8_t(s >> 56);
      b[4 + j] = (v & 0x7F) == 0x7F ? uint8_t(v & 0xFE) : v;  // no NaN codes
    }
  }
}

float e2m1_to_f32(uint8_t v) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return v & 0x8 ? -kMagnitude[v & 0x7] : kMagnitude[v & 0x7];
}

void dequantize_nvfp4_block(const uint8_t* b, float* y) {
  float global;
  std::memcpy(&global, b, 4);
  for (int64_t i = 0; i < kNvfp4Block; ++i) {
    const float scale = f8e4m3_to_f32(b[4 + i / kNvfp4Group]) * global;
    const uint8_t byte = b[8 + i / 2];
    y[i] = e2m1_to_f32(i % 2 ? byte >> 4 : byte & 0xF) * scale;
  }
}

void pack_nvfp4(const uint8_t* values, const uint8_t* scales, float global, int64_t N, int64_t K, uint8_t* out_blocks,
                float* out_f32) {
  RV_CHECK(K % kNvfp4Group == 0, "NVFP4 weight: K = ", K, " is not a multiple of ", kNvfp4Group);
  if (out_f32) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = values[n * (K / 2) + k / 2];
        out_f32[n * K + k] = e2m1_to_f32(k % 2 ? byte >> 4 : byte & 0xF) *
                             f8e4m3_to_f32(scales[n * (K / kNvfp4Group) + k / kNvfp4Group]) * global;
      }
    return;
  }
  RV_CHECK(K % kNvfp4Block == 0, "NVFP4 blocks: K = ", K, " is not a multiple of ", kNvfp4Block);
  const int64_t block_bytes = dtype_bytes(DType::kNVFP4, kNvfp4Block), per_block = kNvfp4Block / kNvfp4Group;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kb = 0; kb < K / kNvfp4Block; ++kb) {
      uint8_t* b = out_blocks + (n * (K / kNvfp4Block) + kb) * block_bytes;
      std::memcpy(b, &global, 4);
      std::memcpy(b + 4, scales + n * (K / kNvfp4Group) + kb * per_block, size_t(per_block));
      std::memcpy(b + 8, values + n * (K / 2) + kb * kNvfp4Block / 2, size_t(kNvfp4Block / 2));
    }
}

void fill_nvfp4_dummy(int64_t rows, int64_t cols, float bound, uint64_t seed, uint8_t* out) {
  const int64_t blocks = rows * (cols / kNvfp4Block), block_bytes = dtype_bytes(DType::kNVFP4, kNvfp4Block);
  const float global = bound / 6.0f;  // block scales of 1.0 (E4M3 0x38)
  uint64_t s = seed | 1;
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = out + i * block_bytes;
    std::memcpy(b, &global, 4);
    std::memset(b + 4, 0x38, 4);
    for (int64_t at = 8; at < block_bytes; at += 8) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      std::memcpy(b + at, &s, 8);
    }
  }
}

}  // namespace revolta
