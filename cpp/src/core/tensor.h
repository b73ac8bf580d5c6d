// Tensor: shape + strides + dtype + device over a shared buffer. Views share the buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace revolta {

enum class Device : uint8_t { kCPU, kCUDA };

// Owns (or keeps alive) the bytes a tensor points into: heap memory or a file mapping.
struct Buffer {
  virtual ~Buffer() = default;
};

// A backend that owns device memory registers how to allocate bytes there (zeroed on request).
using DeviceAllocator = std::shared_ptr<Buffer> (*)(size_t bytes, bool zero, void** data);
void register_device_allocator(Device device, DeviceAllocator allocator);

// "[2, 3]": a shape as messages print it.
std::string shape_text(const std::vector<int64_t>& shape);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zeroed memory on the device (host memory for kCPU).
  static Tensor empty(std::vector<int64_t> shape, DType dtype, Device device = Device::kCPU);
  // Allocates without clearing: for buffers the next op overwrites (activations).
  static Tensor uninitialized(std::vector<int64_t> shape, DType dtype, Device device = Device::kCPU);
  // Wraps external memory kept alive by owner (may be null for borrowed memory).
  static Tensor wrap(void* data, std::vector<int64_t> shape, DType dtype,
                     std::shared_ptr<Buffer> owner, Device device = Device::kCPU);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_[d < 0 ? d + dim() : d]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(dtype_bytes(dtype_, numel())); }
  bool is_contiguous() const;
  std::string shape_str() const;

  void* data() const { return data_; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data_); }

  // Rows [begin, end) of the first dimension, as a view.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // Same bytes, new shape (contiguous tensors only).
  Tensor view(std::vector<int64_t> shape) const;
  // A contiguous copy on `device` (this tensor itself when it already lives there).
  Tensor to(Device device) const;

 private:
  static Tensor allocate(std::vector<int64_t> shape, DType dtype, Device device, bool zero);
  void* data_ = nullptr;
  std::vector<int64_t> shape_, strides_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCPU;
  std::shared_ptr<Buffer> owner_;
};

}  // namespace revolta
