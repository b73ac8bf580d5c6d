// The WeightLoader's quantized checkpoints: each format's tensors beside a linear layer's name,
// repacked into the engine's blocks (quant/) or, where the model does not take blocks there, into
// the float matrix they stand for.
#include <string>
#include <vector>

#include "core/error.h"
#include "model/weights.h"
#include "quant/fp8_blocks.h"
#include "quant/int4_groups.h"

namespace revolta {
namespace {

// "X" for "X.weight", else empty.
std::string matrix_base(const std::string& name) {
  static const std::string kSuffix = ".weight";
  if (name.size() <= kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return {};
  return name.substr(0, name.size() - kSuffix.size());
}

}  // namespace

std::string WeightLoader::awq_base(const std::string& name) const {
  const std::string base = matrix_base(name);
  return !base.empty() && where_.count(base + ".qweight") ? base : std::string();
}

SafetensorsEntry WeightLoader::awq_entry(const std::string& base, std::vector<uint8_t>& storage) const {
  auto part = [&](const char* suffix, DType dt) -> const SafetensorsEntry& {
    auto it = where_.find(base + suffix);
    RV_CHECK(it != where_.end(), "model ", dir_, ": AWQ weight ", base, " has no ", base, suffix);
    const SafetensorsEntry& e = it->second->entries().at(base + suffix);
    RV_CHECK(e.dtype == dt && e.shape.size() == 2, "model ", dir_, ": AWQ tensor ", base, suffix, " must be a 2-D ",
             dtype_name(dt), " tensor (AutoAWQ GEMM layout), got ", dtype_name(e.dtype), " ", shape_text(e.shape));
    return e;
  };
  const SafetensorsEntry &qw = part(".qweight", DType::kI32), &qz = part(".qzeros", DType::kI32), &sc = part(".scales", DType::kF16);
  const int64_t K = qw.shape[0], N = qw.shape[1] * 8, groups = sc.shape[0];
  RV_CHECK(groups > 0 && K % groups == 0 && sc.shape[1] == N && qz.shape[0] == groups && qz.shape[1] == N / 8, "model ", dir_,
           ": AWQ weight ", base, ": qweight ", shape_text(qw.shape), ", qzeros ", shape_text(qz.shape), " and scales ",
           shape_text(sc.shape), " do not describe one [N, K] matrix in groups along K");
  const DType t = int4_group_dtype(K / groups, (base + ".qweight").c_str());
  const auto* q = static_cast<const int32_t*>(qw.data);
  const auto* z = static_cast<const int32_t*>(qz.data);
  const auto* s = static_cast<const uint16_t*>(sc.data);
  if (K % dtype_block_values(t) != 0) {  // rows not a whole number of blocks: held dequantized
    storage.resize(size_t(N * K) * 4);
    dequantize_awq(q, z, s, N, K, K / groups, reinterpret_cast<float*>(storage.data()));
    return SafetensorsEntry{DType::kF32, {N, K}, storage.data(), storage.size()};
  }
  storage.resize(size_t(dtype_bytes(t, N * K)));
  repack_awq(q, z, s, N, K, K / groups, storage.data());
  return SafetensorsEntry{t, {N, K}, storage.data(), storage.size()};
}

SafetensorsEntry WeightLoader::fp8_entry(const std::string& name, const SafetensorsEntry& e, bool blocks,
                                         std::vector<uint8_t>& storage) const {
  const std::string base = matrix_base(name).empty() ? name : matrix_base(name);
  const std::string scale_name = where_.count(base + ".weight_scale_inv") ? base + ".weight_scale_inv" : base + ".weight_scale";
  auto it = where_.find(scale_name);
  RV_CHECK(it != where_.end() && e.shape.size() == 2, "model ", dir_, ": FP8 weight ", name, " has no ", base,
           ".weight_scale_inv or .weight_scale beside it (or is not a matrix)");
  const SafetensorsEntry& se = it->second->entries().at(scale_name);
  int64_t n = 1;
  for (int64_t d : se.shape) n *= d;
  std::vector<float> scales(static_cast<size_t>(n));
  convert_to_f32(se.data, se.dtype, scales.data(), size_t(n));
  const int64_t N = e.shape[0], K = e.shape[1];
  const int64_t rows = se.shape.empty() ? 1 : se.shape[0], cols = se.shape.size() < 2 ? 1 : se.shape[1];
  const auto* w = static_cast<const uint8_t*>(e.data);
  if (blocks && K % kF8Block == 0) {
    storage.resize(size_t(dtype_bytes(DType::kF8G128, N * K)));
    pack_f8(w, scales.data(), rows, cols, N, K, storage.data(), nullptr);
    return SafetensorsEntry{DType::kF8G128, {N, K}, storage.data(), storage.size()};
  }
  storage.resize(size_t(N * K) * 4);
  pack_f8(w, scales.data(), rows, cols, N, K, nullptr, reinterpret_cast<float*>(storage.data()));
  return SafetensorsEntry{DType::kF32, {N, K}, storage.data(), storage.size()};
}

std::string WeightLoader::nvfp4_base(const std::string& name) const {
  auto it = where_.find(name);
  const std::string base = matrix_base(name);
  if (it == where_.end() || it->second->entries().at(name).dtype != DType::kU8 || base.empty()) return {};
  return where_.count(base + ".weight_scale_2") ? base : std::string();
}

SafetensorsEntry WeightLoader::nvfp4_entry(const std::string& base, const SafetensorsEntry& e, bool blocks,
                                           std::vector<uint8_t>& storage) const {
  auto part = [&](const char* suffix) -> const SafetensorsEntry& {
    auto it = where_.find(base + suffix);
    RV_CHECK(it != where_.end(), "model ", dir_, ": NVFP4 weight ", base, " has no ", base, suffix);
    return it->second->entries().at(base + suffix);
  };
  const SafetensorsEntry &sc = part(".weight_scale"), &g = part(".weight_scale_2");
  RV_CHECK(e.shape.size() == 2 && sc.dtype == DType::kF8E4M3 && sc.shape.size() == 2 && sc.shape[0] == e.shape[0] &&
               sc.shape[1] * kNvfp4Group == e.shape[1] * 2,
           "model ", dir_, ": NVFP4 weight ", base, ": values ", shape_text(e.shape), " (uint8, two a byte) and scales ",
           dtype_name(sc.dtype), " ", shape_text(sc.shape), " are not ModelOpt's layout (E4M3 scales per 16 values)");
  float global = 0.0f;
  convert_to_f32(g.data, g.dtype, &global, 1);
  const int64_t N = e.shape[0], K = e.shape[1] * 2;
  const auto* v = static_cast<const uint8_t*>(e.data);
  const auto* s = static_cast<const uint8_t*>(sc.data);
  if (blocks && K % kNvfp4Block == 0) {
    storage.resize(size_t(dtype_bytes(DType::kNVFP4, N * K)));
    pack_nvfp4(v, s, global, N, K, storage.data(), nullptr);
    return SafetensorsEntry{DType::kNVFP4, {N, K}, storage.data(), storage.size()};
  }
  storage.resize(size_t(N * K) * 4);
  pack_nvfp4(v, s, global, N, K, nullptr, reinterpret_cast<float*>(storage.data()));
  return SafetensorsEntry{DType::kF32, {N, K}, storage.data(), storage.size()};
}

}  // namespace revolta
