#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

#define RV_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t err_ = (expr);                                                                \
    RV_CHECK(err_ == cudaSuccess, #expr, " failed: ", cudaGetErrorString(err_));              \
  } while (0)
