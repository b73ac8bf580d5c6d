// A read-only memory mapping of a whole file, kept alive as a tensor Buffer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace revolta {

struct MappedFile : Buffer {
  const char* data = nullptr;
  size_t size = 0;
  ~MappedFile() override;
};

// Throws std::runtime_error naming the file when it cannot be opened or mapped.
std::shared_ptr<MappedFile> map_file(const std::string& path);

}  // namespace revolta
