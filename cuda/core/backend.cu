// Device memory, transfers and the registration of the CUDA op table.
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

struct DeviceBuffer : Buffer {
  void* ptr = nullptr;
  ~DeviceBuffer() override {
    if (ptr) cudaFree(ptr);
  }
};

std::shared_ptr<Buffer> allocate(size_t bytes, void** data) {
  auto buf = std::make_shared<DeviceBuffer>();
  RV_CUDA_CHECK(cudaMalloc(&buf->ptr, bytes ? bytes : 1));
  RV_CUDA_CHECK(cudaMemset(buf->ptr, 0, bytes ? bytes : 1));
  *data = buf->ptr;
  return buf;
}

struct Registration {
  Registration() {
    register_device_allocator(Device::kCUDA, &allocate);
    ops::register_backend(Device::kCUDA, table());
  }
} registration;

}  // namespace

Tensor to_device(const Tensor& host) {
  Tensor d = Tensor::empty(host.shape(), host.dtype(), Device::kCUDA);
  RV_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

Tensor to_host(const Tensor& dev) {
  Tensor h = Tensor::empty(dev.shape(), dev.dtype());
  RV_CUDA_CHECK(cudaMemcpy(h.data(), dev.data(), dev.nbytes(), cudaMemcpyDeviceToHost));
  return h;
}

void synchronize() { RV_CUDA_CHECK(cudaDeviceSynchronize()); }

double measure_copy_bandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  RV_CUDA_CHECK(cudaMalloc(&a, bytes));
  RV_CUDA_CHECK(cudaMalloc(&b, bytes));
  RV_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int reps = 10;
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) * reps / (double(ms) / 1e3);
}

std::string device_name() {
  cudaDeviceProp prop{};
  RV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name + std::string(" (compute capability ") + std::to_string(prop.major) + "." +
         std::to_string(prop.minor) + ")";
}

const ops::OpTable* table() {
  static const ops::OpTable t = [] {
    ops::OpTable o;
    o.embedding = &embedding;
    o.rms_norm = &rms_norm;
    o.add_rms_norm = &add_rms_norm;
    o.silu_mul = &silu_mul;
    o.rope = &rope;
    o.linear = &linear;
    o.paged_attention = &paged_attention;
    o.kv_cache_write = &kv_cache_write;
    return o;
  }();
  return &t;
}

}  // namespace revolta::cuda
