// GGUF's quantized weight blocks (the formats llama.cpp writes), kept as they are on disk: each
// block holds a run of values along a row with its own scales. dequantize_blocks is the
// reference every kernel over these blocks is checked against, and is itself checked against the
// `gguf` package's dequantization.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace revolta {

// GGUF's tensor type numbers (ggml_type) for the formats the engine reads.
enum class GgufType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30
};

struct BlockFormat {
  int32_t values = 1;  // values per block
  int32_t bytes = 4;   // bytes per block
};

// Throws std::invalid_argument naming the type number when the engine does not read it.
BlockFormat block_format(uint32_t gguf_type);
const char* gguf_type_name(uint32_t gguf_type);
// Bytes of n values (n a multiple of the block's values).
int64_t block_bytes(uint32_t gguf_type, int64_t n);
// n values (a multiple of the block's values) from their blocks to float32.
void dequantize_blocks(uint32_t gguf_type, const void* blocks, float* out, int64_t n);
// The engine's element type of a GGUF tensor type, and back.
DType dtype_of_gguf(uint32_t gguf_type);
uint32_t gguf_type_of(DType t);
// dequantize_blocks for an engine element type (block or not).
void dequantize(DType t, const void* data, float* out, int64_t n);

}  // namespace revolta
