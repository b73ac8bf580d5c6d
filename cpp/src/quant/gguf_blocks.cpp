#include "quant/gguf_blocks.h"

#include <cstring>
#include <stdexcept>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/fp8_blocks.h"
#include "quant/int4_groups.h"

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
// Q5_K: the same with a fifth bit per value: 32 bytes qh between the scales and the nibbles, bit
// 2 pair (2 pair + 1) of byte l the top bit of value l of the pair's first (second) sub-block.
template <bool kFifthBit>
void q4_5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + (kFifthBit ? 48 : 16);
  for (int pair = 0; pair < 4; ++pair, q += 32, y += 64) {
    float sc0, m0, sc1, m1;
    scale_min(s, 2 * pair, sc0, m0);
    scale_min(s, 2 * pair + 1, sc1, m1);
    const uint8_t lo = uint8_t(1u << (2 * pair)), hi = uint8_t(2u << (2 * pair));
    for (int l = 0; l < 32; ++l) {
      const int top0 = kFifthBit && (qh[l] & lo) ? 16 : 0, top1 = kFifthBit && (qh[l] & hi) ? 16 : 0;
      y[l] = d * sc0 * float((q[l] & 0xF) + top0) - dmin * m0;
      y[l + 32] = d * sc1 * float((q[l] >> 4) + top1) - dmin * m1;
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

// The formats the engine reads: GGUF's type number and name, the engine's element type (which
// knows the block sizes, core/dtype.h) and the block decoder (none: an element type).
struct Format {
  GgufType gguf;
  const char* name;
  DType dtype;
  void (*block)(const uint8_t*, float*);
};

constexpr Format kFormats[] = {
    {GgufType::kF32, "F32", DType::kF32, nullptr},      {GgufType::kF16, "F16", DType::kF16, nullptr},
    {GgufType::kBF16, "BF16", DType::kBF16, nullptr},   {GgufType::kQ4_0, "Q4_0", DType::kQ4_0, q4_0},
    {GgufType::kQ4_1, "Q4_1", DType::kQ4_1, q4_1},      {GgufType::kQ8_0, "Q8_0", DType::kQ8_0, q8_0},
    {GgufType::kQ4_K, "Q4_K", DType::kQ4_K, q4_5_k<false>}, {GgufType::kQ5_K, "Q5_K", DType::kQ5_K, q4_5_k<true>},
    {GgufType::kQ6_K, "Q6_K", DType::kQ6_K, q6_k},
};

const Format* by_gguf(uint32_t t) {
  for (const Format& f : kFormats)
    if (uint32_t(f.gguf) == t) return &f;
  return nullptr;
}

}  // namespace

const char* gguf_type_name(uint32_t t) {
  const Format* f = by_gguf(t);
  return f ? f->name : "unsupported";
}

DType dtype_of_gguf(uint32_t t) {
  const Format* f = by_gguf(t);
  if (!f)
    throw std::invalid_argument(str_cat("GGUF tensor type ", t, " is not supported (supported: F32, F16, BF16, Q4_0, ",
                                        "Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)"));
  return f->dtype;
}

void dequantize(DType t, const void* data, float* out, int64_t n) {
  dtype_bytes(t, n);  // throws unless n is a whole number of blocks
  const int64_t values = dtype_block_values(t), bytes = dtype_bytes(t, values);
  if (!is_block_dtype(t)) return convert_to_f32(data, t, out, size_t(n));
  const auto* b = static_cast<const uint8_t*>(data);
  if (t == DType::kI4G32 || t == DType::kI4G128) {
    for (int64_t i = 0; i < n / values; ++i) dequantize_int4_block(t, b + i * bytes, out + i * values);
    return;
  }
  if (t == DType::kF8G128 || t == DType::kNVFP4) {
    const auto block = t == DType::kF8G128 ? dequantize_f8_block : dequantize_nvfp4_block;
    for (int64_t i = 0; i < n / values; ++i) block(b + i * bytes, out + i * values);
    return;
  }
  const Format* f = nullptr;
  for (const Format& g : kFormats)
    if (g.dtype == t) f = &g;
  RV_CHECK(f && f->block, "dequantize: no block decoder for ", dtype_name(t));
  for (int64_t i = 0; i < n / values; ++i) f->block(b + i * bytes, out + i * values);
}

}  // namespace revolta
