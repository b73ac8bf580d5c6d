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

}  // namespace revolta
