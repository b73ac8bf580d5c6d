// Element types and the scalar conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace revolta {

// The block types are quantized weights: a run of values along a row shares its scales, so their
// sizes are per block, not per element. kQ4_0 .. kQ6_K are GGUF's blocks as stored
// (quant/gguf_blocks.h); kI4G32 / kI4G128 are 4-bit integers with a scale and a zero point per
// group of 32 / 128, four groups a block (AWQ's format in the engine's layout, quant/int4_groups.h);
// kF8G128 is FP8 E4M3 with a float32 scale per 128 values (quant/fp8_blocks.h); kNVFP4 is FP4 E2M1
// with an E4M3 scale per 16 values and a float32 global scale (quant/fp8_blocks.h). kF8E4M3 is the
// plain element type checkpoints store FP8 weights and scales in (OCP E4M3FN); kI8 is a signed byte
// (an int8 KV cache's values).
enum class DType : uint8_t {
  kF32, kF16, kBF16, kI32, kI64, kU8, kF8E4M3, kI8,
  kQ4_0, kQ4_1, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kI4G32, kI4G128, kF8G128, kNVFP4
};

// Bytes per element; throws std::logic_error for a block type (use dtype_bytes).
size_t dtype_size(DType t);
bool is_block_dtype(DType t);
// Values per block (1 for element types).
int64_t dtype_block_values(DType t);
// Bytes of n values (a whole number of blocks for a block type).
int64_t dtype_bytes(DType t, int64_t n);
const char* dtype_name(DType t);
// Parses names used by safetensors ("F32", "F16", "BF16", ...) and by options ("float16").
DType parse_dtype(const std::string& name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// Without branches (normal, subnormal and inf / NaN picked by masks), so loops over it vectorise.
inline float f16_to_f32(uint16_t h) {
  const uint32_t exp = h & 0x7c00u, mant = h & 0x3ffu;
  const uint32_t normal = ((exp >> 10) + (127 - 15)) << 23 | mant << 13;
  const float sub = float(mant) * 0x1p-24f;  // exact: mant < 2^10
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  const uint32_t sub_mask = 0u - uint32_t(exp == 0), special = 0u - uint32_t(exp == 0x7c00u);
  const uint32_t bits = (normal & ~sub_mask & ~special) | (sub_bits & sub_mask) | ((0x7f800000u | mant << 13) & special) |
                        uint32_t(h & 0x8000u) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// OCP FP8 E4M3FN (bias 7, no infinities, 0x7F / 0xFF NaN, largest 448).
float f8e4m3_to_f32(uint8_t v);
// To E4M3FN, rounding to nearest even; magnitudes past 448 saturate to 448 (NaN stays NaN).
uint8_t f32_to_f8e4m3(float f);
uint16_t f32_to_f16(float f);

// Converts n elements of src (type st) to float.
void convert_to_f32(const void* src, DType st, float* dst, size_t n);
// Converts n floats to dst (type dt: f32, f16 or bf16).
void convert_from_f32(const float* src, void* dst, DType dt, size_t n);

}  // namespace revolta
