// Reads .safetensors files through a read-only memory mapping.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace revolta {

struct SafetensorsEntry {
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};

class SafetensorsFile {
 public:
  // Maps the file and parses its header; throws std::runtime_error naming the file on any defect
  // (truncated header, bad JSON, offsets outside the file, sizes that disagree with shapes).
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  // A tensor view into the mapping; keeps the mapping alive.
  Tensor tensor(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<Buffer> mapping_;
  std::map<std::string, SafetensorsEntry> entries_;
};

}  // namespace revolta
