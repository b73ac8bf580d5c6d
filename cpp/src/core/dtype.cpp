#include "core/dtype.h"

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
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
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
  throw std::invalid_argument(str_cat("unsupported dtype '", n, "'"));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
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

void convert_to_f32(const void* src, DType st, float* dst, size_t n) {
  switch (st) {
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
