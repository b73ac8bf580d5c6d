#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace revolta::cuda {
// Throws DeviceError naming the call, where it was made and the error; an out-of-memory error also
// says how much device memory was free and how much the engine's pool held cached.
[[noreturn]] void cuda_call_failed(const char* expr, const char* file, int line, cudaError_t err);
}  // namespace revolta::cuda

#define RV_CUDA_CHECK(expr)                                                                  \
  do {                                                                                       \
    cudaError_t err_ = (expr);                                                               \
    if (err_ != cudaSuccess) ::revolta::cuda::cuda_call_failed(#expr, __FILE__, __LINE__, err_); \
  } while (0)
