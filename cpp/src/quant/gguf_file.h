// Reads a GGUF file (llama.cpp's single-file model format, versions 2 and 3) through a read-only
// memory mapping: its metadata and its tensors, quantized ones left in their blocks
// (quant/gguf_blocks.h). Every offset and length is checked against the file, so a truncated or
// corrupt file is an error naming it, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file_mapping.h"

namespace revolta {

struct GgufValue {
  enum class Kind { kInt, kFloat, kBool, kString, kArray } kind = Kind::kInt;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<GgufValue> array;
};

struct GgufTensor {
  std::string name;
  uint32_t type = 0;           // GgufType
  std::vector<int64_t> shape;  // row-major (GGUF lists dimensions fastest first)
  const void* data = nullptr;
  int64_t nbytes = 0;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // Null when absent.
  const GgufTensor* find(const std::string& name) const;
  // The mapping the tensors' data points into (keep it alive while they are used).
  std::shared_ptr<MappedFile> mapping() const { return map_; }

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::shared_ptr<MappedFile> map_;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace revolta
