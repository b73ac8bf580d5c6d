#include "core/dtype.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace revolta {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kF8E4M3: return 1;
    case DType::kI8: return 1;
    default: break;
  }
  throw std::logic_error(str_cat(dtype_name(t), " is a block type: its size is per block"));
}

namespace {

struct Block {
  int64_t values, bytes;
};

Block block_of(DType t) {
  switch (t) {
    case DType::kQ4_0: return {32, 18};
    case DType::kQ4_1: return {32, 20};
    case DType::kQ8_0: return {32, 34};
    case DType::kQ4_K: return {256, 144};
    case DType::kQ5_K: return {256, 176};
    case DType::kQ6_K: return {256, 210};
    case DType::kI4G32: return {128, 80};
    case DType::kI4G128: return {512, 272};
    case DType::kF8G128: return {128, 132};
    case DType::kNVFP4: return {64, 40};
    default: return {1, int64_t(dtype_size(t))};
  }
}

}  // namespace

bool is_block_dtype(DType t) { return t >= DType::kQ4_0; }

int64_t dtype_block_values(DType t) { return block_of(t).values; }

int64_t dtype_bytes(DType t, int64_t n) {
  const Block b = block_of(t);
  RV_CHECK(n % b.values == 0, dtype_name(t), ": ", n, " values are not a whole number of ", b.values, "-value blocks");
  return n / b.values * b.bytes;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    case DType::kF8E4M3: return "float8_e4m3";
    case DType::kI8: return "int8";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_K: return "q4_k";
    case DType::kQ5_K: return "q5_k";
    case DType::kQ6_K: return "q6_k";
    case DType::kI4G32: return "int4_g32";
    case DType::kI4G128: return "int4_g128";
    case DType::kF8G128: return "float8_g128";
    case DType::kNVFP4: return "nvfp4";
  }
  return "?";
}

DType parse_dtype(const std::string& n) {
  if (n == "F32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "F16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "BF16" || n == "bfloat16") return DType::kBF16;
  if (n == "I32" || n == "int32") return DType::kI32;
  if (n == "I64" || n == "int64") return DType::kI64;
  if (n == "U8" || n == "uint8" || n == "BOOL") return DType::kU8;
  if (n == "F8_E4M3" || n == "float8_e4m3") return DType::kF8E4M3;
  if (n == "I8" || n == "int8") return DType::kI8;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                  DType::kI4G32, DType::kI4G128, DType::kF8G128,
                  DType::kNVFP4}) {
    std::string upper = dtype_name(t);
    for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
    if (n == dtype_name(t) || n == upper) return t;
  }
  throw std::invalid_argument(str_cat("unsupported dtype '", n, "'"));
}

uint16_t f32_to_f16(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {                                   // subnormal or zero in f16
    float af;
    std::memcpy(&af, &ax, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(af * 16777216.0f)));  // 2^24
  }
  uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return uint16_t(sign | (ax >> 13));
}

float f8e4m3_to_f32(uint8_t v) {
  const int exp = (v >> 3) & 0xF, mant = v & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  const float mag = exp == 0 ? std::ldexp(float(mant), -9) : std::ldexp(float(8 + mant), exp - 10);
  return v & 0x80 ? -mag : mag;
}

uint8_t f32_to_f8e4m3(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0.015625f) return sign | uint8_t(std::nearbyint(a * 512.0f));  // subnormal steps of 2^-9 (8: 2^-6)
  int e = 0;
  const float fr = std::frexp(a, &e);  // a = fr 2^e, fr in [0.5, 1): 1.mmm 2^(e - 1)
  int q = int(std::nearbyint(fr * 16.0f)), exp = e - 1 + 7;
  if (q == 16) q = 8, ++exp;
  return uint8_t(sign | exp << 3 | (q - 8));
}

void convert_to_f32(const void* src, DType st, float* dst, size_t n) {
  switch (st) {
    case DType::kF8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(s[i]);
      return;
    }
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    default: throw std::invalid_argument(str_cat("cannot convert ", dtype_name(st), " to float32"));
  }
}

void convert_from_f32(const float* src, void* dst, DType dt, size_t n) {
  switch (dt) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    default: throw std::invalid_argument(str_cat("cannot convert float32 to ", dtype_name(dt)));
  }
}

}  // namespace revolta
