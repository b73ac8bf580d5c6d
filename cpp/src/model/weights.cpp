#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "ops/ops.h"

namespace revolta {
namespace fs = std::filesystem;

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

WeightLoader::WeightLoader(const std::string& dir, Device device, bool dummy)
    : dir_(dir), device_(device), dummy_(dummy) {
  if (dummy_) return;
  std::vector<std::string> shard_names;
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream f(index);
    std::stringstream ss;
    ss << f.rdbuf();
    Json j = Json::parse(ss.str());
    std::set<std::string> uniq;
    for (const auto& [name, file] : j["weight_map"].as_object()) uniq.insert(file.as_string());
    shard_names.assign(uniq.begin(), uniq.end());
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename());
    std::sort(shard_names.begin(), shard_names.end());
  }
  RV_CHECK(!shard_names.empty(), "no *.safetensors weights found in ", dir);
  for (const auto& name : shard_names) {
    fs::path p = fs::path(dir) / name;
    RV_CHECK(fs::exists(p), "weight shard ", p.string(), " listed in the index does not exist");
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    for (const auto& [tname, entry] : files_.back()->entries()) where_[tname] = files_.back().get();
  }
}

bool WeightLoader::has(const std::string& name) const { return dummy_ || where_.count(name) > 0; }

std::vector<std::string> WeightLoader::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : where_) out.push_back(n);
  return out;
}

std::vector<int64_t> WeightLoader::shape(const std::string& name) const { return entry(name).shape; }

const SafetensorsEntry& WeightLoader::entry(const std::string& name) const {
  auto it = where_.find(name);
  RV_CHECK(it != where_.end(), "model ", dir_, ": missing tensor '", name, "'");
  return it->second->entries().at(name);
}

Tensor WeightLoader::get(const std::string& name, const std::vector<int64_t>& shape,
                         DType dtype) const {
  return get(name, shape, dtype, device_);
}

Tensor WeightLoader::get(const std::string& name, const std::vector<int64_t>& shape, DType dtype, Device on) const {
  return get_stacked({name}, {shape}, dtype, on).view(shape);
}

Tensor WeightLoader::make_dummy(const std::string& name, std::vector<int64_t> shape, DType dtype, Device on) const {
  Tensor t = Tensor::uninitialized(shape, dtype, on);
  const uint64_t seed = std::hash<std::string>{}(name);
  if (shape.size() == 1) {
    ops::fill_uniform(t, seed, 0.9f, 1.1f);  // norm weights
  } else {
    const float a = 1.0f / std::sqrt(float(shape.back()));  // keeps activations O(1) through the layers
    ops::fill_uniform(t, seed, -a, a);
  }
  return t;
}

Tensor WeightLoader::get_stacked(const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& shapes,
                                 DType dtype) const {
  return get_stacked(names, shapes, dtype, device_);
}

Tensor WeightLoader::get_stacked(const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& shapes, DType dtype, Device on) const {
  if (dummy_) {
    std::vector<int64_t> shape = shapes[0];
    std::string key;
    for (size_t i = 0; i < names.size(); ++i) {
      key += names[i] + ";";
      if (i > 0 && !shape.empty()) shape[0] += shapes[i].empty() ? 1 : shapes[i][0];
    }
    return make_dummy(key, shape, dtype, on);
  }
  int64_t rows = 0, cols = -1;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& e = entry(names[i]);
    RV_CHECK(e.shape == shapes[i], "model ", dir_, ": tensor '", names[i], "' has shape ",
             shape_text(e.shape), ", expected ", shape_text(shapes[i]));
    int64_t c = 1;
    for (size_t d = 1; d < e.shape.size(); ++d) c *= e.shape[d];
    RV_CHECK(cols < 0 || c == cols, "cannot stack '", names[i], "': row width differs");
    cols = c;
    rows += e.shape.empty() ? 1 : e.shape[0];
  }
  Tensor out = Tensor::empty({rows, cols}, dtype);
  char* dst = static_cast<char*>(out.data());
  std::vector<float> tmp;
  for (const auto& name : names) {
    const auto& e = entry(name);
    size_t n = e.nbytes / dtype_size(e.dtype);
    if (e.dtype == dtype) {
      std::memcpy(dst, e.data, e.nbytes);
    } else {
      tmp.resize(n);
      convert_to_f32(e.data, e.dtype, tmp.data(), n);
      if (dtype == DType::kF16) {  // bf16/f32 checkpoints on a device without bf16: values must fit
        for (size_t i = 0; i < n; ++i)
          RV_CHECK(!(std::fabs(tmp[i]) > 65504.0f), "model ", dir_, ": tensor '", name, "' holds ", tmp[i],
                   ", outside the float16 range (|x| <= 65504); run it in float32 or bfloat16 on the CPU");
      }
      convert_from_f32(tmp.data(), dst, dtype, n);
    }
    dst += n * dtype_size(dtype);
  }
  return out.to(on);
}

}  // namespace revolta
