#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define RV_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    if (err_ != cudaSuccess)                                                                  \
      throw ::revolta::DeviceError(::revolta::str_cat(#expr, " failed: ", cudaGetErrorString(err_))); \
  } while (0)
