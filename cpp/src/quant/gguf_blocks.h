// GGUF's quantized weight blocks (the formats llama.cpp writes), kept as they are on disk: each
// block holds a run of values along a row with its own scales. dequantize is the
// reference every kernel over these blocks is checked against, and is itself checked against the
// `gguf` package's dequantization.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace revolta {

// GGUF's tensor type numbers (ggml_type) for the formats the engine reads.
enum class GgufType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kBF16 = 30
};

// GGUF's name of a type number ("Q4_K"; "unsupported" for others).
const char* gguf_type_name(uint32_t gguf_type);
// The engine's element type of a GGUF tensor type (its block sizes: core/dtype.h); throws
// std::invalid_argument naming the type number when the engine does not read it.
DType dtype_of_gguf(uint32_t gguf_type);
// n values (a whole number of blocks) of type t (any element or block type) to float32.
void dequantize(DType t, const void* data, float* out, int64_t n);

}  // namespace revolta
