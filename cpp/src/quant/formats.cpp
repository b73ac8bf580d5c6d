#include "quant/formats.h"

#include "core/error.h"
#include "quant/int4_groups.h"

namespace revolta {

const std::vector<WeightFormat>& weight_formats() {
  static const std::vector<WeightFormat> rows = {
      {"awq", 128, [](int32_t g) { return int4_group_dtype(g, "quantization awq"); },
       [](int64_t v, int32_t g) { return v / 2 + v / g * 4; },  // 4-bit values, an f16 scale and zero per group
       "awq int4 g{g}", "AutoAWQ GEMM: qweight / qzeros / scales (4-bit, zero points, groups of 32 or 128)"},
      {"fp8", 128, [](int32_t) { return DType::kF8G128; },
       [](int64_t v, int32_t g) { return v + v / g * 4; },  // E4M3 values, an f32 scale per 128
       "fp8 e4m3, a scale per {g}", "E4M3 weight with weight_scale_inv / weight_scale (HF fp8, compressed-tensors float, ModelOpt FP8)"},
      {"nvfp4", 16, [](int32_t) { return DType::kNVFP4; },
       [](int64_t v, int32_t) { return v / 64 * 40; },  // blocks of 64: a global scale, four E4M3 scales, 32 bytes of E2M1
       "nvfp4 e2m1, an e4m3 scale per {g}", "ModelOpt NVFP4: packed E2M1 weight, weight_scale (E4M3), weight_scale_2"},
  };
  return rows;
}

std::string weight_format_names() {
  std::string names;
  for (const WeightFormat& f : weight_formats()) names += (names.empty() ? "" : ", ") + std::string(f.method);
  return names;
}

const WeightFormat& weight_format(const std::string& method, const char* what) {
  for (const WeightFormat& f : weight_formats())
    if (method == f.method) return f;
  throw std::invalid_argument(str_cat(what, " '", method, "' is not a weight format (", weight_format_names(), ")"));
}

std::string weight_format_label(const std::string& method, int32_t group) {
  std::string label = weight_format(method, "quantization").label;
  const size_t at = label.find("{g}");
  if (at != std::string::npos) label.replace(at, 3, std::to_string(group));
  return label;
}

}  // namespace revolta
