#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/device_runtime.h"
#include "core/error.h"

namespace revolta {
namespace {

struct HostBuffer : Buffer {
  void* ptr;
  HostBuffer(size_t bytes, bool zero) {
    // 64-byte alignment keeps vector loads on one cache line.
    ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!ptr) throw std::bad_alloc();
    if (zero) std::memset(ptr, 0, bytes);
  }
  ~HostBuffer() override { std::free(ptr); }
};

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

DeviceAllocator g_allocators[2] = {nullptr, nullptr};

}  // namespace

void register_device_allocator(Device device, DeviceAllocator allocator) {
  g_allocators[int(device)] = allocator;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  return allocate(std::move(shape), dtype, device, true);
}

Tensor Tensor::uninitialized(std::vector<int64_t> shape, DType dtype, Device device) {
  return allocate(std::move(shape), dtype, device, false);
}

Tensor Tensor::allocate(std::vector<int64_t> shape, DType dtype, Device device, bool zero) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  t.dtype_ = dtype;
  t.device_ = device;
  if (device == Device::kCPU) {
    auto buf = std::make_shared<HostBuffer>(t.nbytes(), zero);
    t.data_ = buf->ptr;
    t.owner_ = std::move(buf);
  } else {
    RV_CHECK(g_allocators[int(device)] != nullptr, "no CUDA backend in this build");
    t.owner_ = g_allocators[int(device)](t.nbytes(), zero, &t.data_);
  }
  return t;
}

Tensor Tensor::wrap(void* data, std::vector<int64_t> shape, DType dtype,
                    std::shared_ptr<Buffer> owner, Device device) {
  Tensor t;
  t.device_ = device;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  t.dtype_ = dtype;
  t.owner_ = std::move(owner);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Tensor::shape_str() const { return shape_text(shape_); }

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  RV_CHECK(dim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
           "slice_rows [", begin, ", ", end, ") out of range for ", shape_str());
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + dtype_bytes(dtype_, begin * strides_[0]);
  return t;
}

Tensor Tensor::view(std::vector<int64_t> shape) const {
  RV_CHECK(is_contiguous(), "view of a non-contiguous tensor");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  RV_CHECK(t.numel() == numel(), "view ", t.shape_str(), " does not match ", shape_str());
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  RV_CHECK(is_contiguous(), "to(): non-contiguous tensor ", shape_str());
  Tensor t = uninitialized(shape_, dtype_, device);
  if (device == Device::kCPU) device_runtime(device_).copy_to_host(t.data(), data_, nbytes());
  else device_runtime(device).copy_to_device(t.data(), data_, nbytes());
  return t;
}

}  // namespace revolta
