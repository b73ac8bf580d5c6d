#include "quant/gguf_blocks.h"

#include <cstring>
#include <stdexcept>

#include "core/dtype.h"
#include "core/error.h"

namespace revolta {
namespace {

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0: a scale d (f16) and 32 4-bit values q, x = (q - 8) d; byte j holds values j (low nibble)
// and j + 16 (high nibble).
void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(int(b[2 + j] & 0xF) - 8) * d;
    y[j + 16] = float(int(b[2 + j] >> 4) - 8) * d;
  }
}

// Q4_1: a scale d and a minimum m (f16), x = q d + m, nibbles as in Q4_0.
void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = float(b[4 + j] & 0xF) * d + m;
    y[j + 16] = float(b[4 + j] >> 4) * d + m;
  }
}

// Q8_0: a scale d and 32 signed bytes, x = q d.
void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// The K formats' 256-value super-blocks hold eight sub-blocks of 32 with 6-bit scales and
// minimums packed in 12 bytes: sub-block i < 4 has its low 6 bits in bytes i (scale) and i + 4
// (minimum); i >= 4 has its low 4 bits in byte i + 4 (scale: low nibble, minimum: high nibble)
// and its top 2 bits in the top bits of bytes i - 4 (scale) and i (minimum).
void scale_min(const uint8_t* s, int i, float& scale, float& minimum) {
  if (i < 4) {
    scale = float(s[i] & 63);
    minimum = float(s[i + 4] & 63);
  } else {
    scale = float((s[i + 4] & 0xF) | ((s[i - 4] >> 6) << 4));
    minimum = float((s[i + 4] >> 4) | ((s[i] >> 6) << 4));
  }
}

// Q4_K: d, dmin (f16), the packed scales, then 128 bytes of nibbles: each 32-byte run holds two
// sub-blocks (low nibbles the first, high nibbles the second); x = d scale q - dmin minimum.
void q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* q = b + 16;
  for (int pair = 0; pair < 4; ++pair, q += 32, y += 64) {
    float sc0, m0, sc1, m1;
    scale_min(s, 2 * pair, sc0, m0);
    scale_min(s, 2 * pair + 1, sc1, m1);
    for (int l = 0; l < 32; ++l) {
      y[l] = d * sc0 * float(q[l] & 0xF) - dmin * m0;
      y[l + 32] = d * sc1 * float(q[l] >> 4) - dmin * m1;
    }
  }
}

// Q5_K: as Q4_K with a fifth bit per value: 32 bytes qh after the scales, bit 2 pair (and
// 2 pair + 1) of byte l giving the top bit of value l of the pair's first (second) sub-block.
void q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int pair = 0; pair < 4; ++pair, q += 32, y += 64) {
    float sc0, m0, sc1, m1;
    scale_min(s, 2 * pair, sc0, m0);
    scale_min(s, 2 * pair + 1, sc1, m1);
    const uint8_t lo = uint8_t(1u << (2 * pair)), hi = uint8_t(2u << (2 * pair));
    for (int l = 0; l < 32; ++l) {
      y[l] = d * sc0 * float((q[l] & 0xF) + ((qh[l] & lo) ? 16 : 0)) - dmin * m0;
      y[l + 32] = d * sc1 * float((q[l] >> 4) + ((qh[l] & hi) ? 16 : 0)) - dmin * m1;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 signed 8-bit scales (one
// per 16 values), then d (f16); x = d scale (q - 32). Each half of 128 values reads 64 low
// bytes and 32 high bytes: value l + 32 i (i = 0..3) takes the low (i even) or high (i odd)
// nibble of low byte l + 32 (i % 2) and bits 2i..2i+1 of high byte l.
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128)
    for (int l = 0; l < 32; ++l) {
      const int g = l / 16;
      for (int i = 0; i < 4; ++i) {
        const uint8_t low = ql[l + 32 * (i % 2)];
        const int nibble = i < 2 ? (low & 0xF) : (low >> 4);
        const int q = (nibble | (((qh[l] >> (2 * i)) & 3) << 4)) - 32;
        y[l + 32 * i] = d * float(sc[g + 2 * i]) * float(q);
      }
    }
}

}  // namespace

BlockFormat block_format(uint32_t t) {
  switch (GgufType(t)) {
    case GgufType::kF32: return {1, 4};
    case GgufType::kF16: return {1, 2};
    case GgufType::kBF16: return {1, 2};
    case GgufType::kQ4_0: return {32, 18};
    case GgufType::kQ4_1: return {32, 20};
    case GgufType::kQ8_0: return {32, 34};
    case GgufType::kQ4_K: return {256, 144};
    case GgufType::kQ5_K: return {256, 176};
    case GgufType::kQ6_K: return {256, 210};
  }
  throw std::invalid_argument(str_cat("GGUF tensor type ", t, " is not supported (supported: F32, F16, BF16, Q4_0, ",
                                      "Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)"));
}

const char* gguf_type_name(uint32_t t) {
  switch (GgufType(t)) {
    case GgufType::kF32: return "F32";
    case GgufType::kF16: return "F16";
    case GgufType::kBF16: return "BF16";
    case GgufType::kQ4_0: return "Q4_0";
    case GgufType::kQ4_1: return "Q4_1";
    case GgufType::kQ8_0: return "Q8_0";
    case GgufType::kQ4_K: return "Q4_K";
    case GgufType::kQ5_K: return "Q5_K";
    case GgufType::kQ6_K: return "Q6_K";
  }
  return "unsupported";
}

int64_t block_bytes(uint32_t t, int64_t n) {
  const BlockFormat f = block_format(t);
  RV_CHECK(n % f.values == 0, gguf_type_name(t), ": ", n, " values are not a whole number of ", f.values, "-value blocks");
  return n / f.values * f.bytes;
}

void dequantize_blocks(uint32_t t, const void* blocks, float* out, int64_t n) {
  const BlockFormat f = block_format(t);
  RV_CHECK(n % f.values == 0, gguf_type_name(t), ": ", n, " values are not a whole number of ", f.values, "-value blocks");
  const auto* b = static_cast<const uint8_t*>(blocks);
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (GgufType(t)) {
    case GgufType::kF32: std::memcpy(out, b, size_t(n) * 4); return;
    case GgufType::kF16: convert_to_f32(b, DType::kF16, out, size_t(n)); return;
    case GgufType::kBF16: convert_to_f32(b, DType::kBF16, out, size_t(n)); return;
    case GgufType::kQ4_0: block = q4_0; break;
    case GgufType::kQ4_1: block = q4_1; break;
    case GgufType::kQ8_0: block = q8_0; break;
    case GgufType::kQ4_K: block = q4_k; break;
    case GgufType::kQ5_K: block = q5_k; break;
    case GgufType::kQ6_K: block = q6_k; break;
  }
  for (int64_t i = 0; i < n / f.values; ++i) block(b + i * f.bytes, out + i * f.values);
}

DType dtype_of_gguf(uint32_t t) {
  switch (GgufType(t)) {
    case GgufType::kF32: return DType::kF32;
    case GgufType::kF16: return DType::kF16;
    case GgufType::kBF16: return DType::kBF16;
    case GgufType::kQ4_0: return DType::kQ4_0;
    case GgufType::kQ4_1: return DType::kQ4_1;
    case GgufType::kQ8_0: return DType::kQ8_0;
    case GgufType::kQ4_K: return DType::kQ4_K;
    case GgufType::kQ5_K: return DType::kQ5_K;
    case GgufType::kQ6_K: return DType::kQ6_K;
  }
  block_format(t);  // throws naming the type
  return DType::kF32;
}

uint32_t gguf_type_of(DType t) {
  switch (t) {
    case DType::kF32: return uint32_t(GgufType::kF32);
    case DType::kF16: return uint32_t(GgufType::kF16);
    case DType::kBF16: return uint32_t(GgufType::kBF16);
    case DType::kQ4_0: return uint32_t(GgufType::kQ4_0);
    case DType::kQ4_1: return uint32_t(GgufType::kQ4_1);
    case DType::kQ8_0: return uint32_t(GgufType::kQ8_0);
    case DType::kQ4_K: return uint32_t(GgufType::kQ4_K);
    case DType::kQ5_K: return uint32_t(GgufType::kQ5_K);
    case DType::kQ6_K: return uint32_t(GgufType::kQ6_K);
    default: break;
  }
  throw std::invalid_argument(str_cat("no GGUF tensor type holds ", dtype_name(t)));
}

void dequantize(DType t, const void* data, float* out, int64_t n) { dequantize_blocks(gguf_type_of(t), data, out, n); }

}  // namespace revolta
