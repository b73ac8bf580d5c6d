// Finds named tensors across the safetensors shards of a model directory and converts them to
// the storage dtype the engine runs with.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"

namespace revolta {

class WeightLoader {
 public:
  // Opens model.safetensors.index.json when present, otherwise every *.safetensors in dir.
  explicit WeightLoader(const std::string& dir);
  bool has(const std::string& name) const;
  // The tensor converted to dtype, with its shape checked. Throws naming the tensor when it is
  // missing or shaped differently.
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype) const;
  // Several [rows_i, cols] tensors stacked along rows into one (fused projections).
  Tensor get_stacked(const std::vector<std::string>& names,
                     const std::vector<std::vector<int64_t>>& shapes, DType dtype) const;
  std::vector<std::string> names() const;
  std::vector<int64_t> shape(const std::string& name) const;
  const std::string& dir() const { return dir_; }

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace revolta
