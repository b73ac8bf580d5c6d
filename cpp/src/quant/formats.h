// The quantized weight formats, one row each: what a checkpoint's quantization_config (or the
// quantization option) names, the op table's element type for its linear layers, its bytes per
// value, where the loader reads it, and the banner's words. The engine's plan, the registry's
// made-up weights, the memory estimate and the option check all read this table; a new format is
// a row here, its loader in model/weights_quantized.cpp and its linear kernels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace revolta {

struct WeightFormat {
  const char* method;        // "awq" | "fp8" | "nvfp4"
  int32_t default_group;     // values per scale, where the checkpoint does not say
  DType (*blocks)(int32_t group);  // the linear layers' element type
  // Bytes of `values` weights in `group`-value groups, scales included (the memory estimate).
  int64_t (*bytes)(int64_t values, int32_t group);
  const char* label;         // the banner's words; {g}: the group size
  const char* checkpoint;    // what the loader reads
};

// Every row, in the order the documents list them.
const std::vector<WeightFormat>& weight_formats();
// The row of `method`; throws std::invalid_argument naming `what` and the methods otherwise.
const WeightFormat& weight_format(const std::string& method, const char* what);
// The supported methods, comma-separated (for messages).
std::string weight_format_names();
// The banner's words for a method and group size.
std::string weight_format_label(const std::string& method, int32_t group);

}  // namespace revolta
