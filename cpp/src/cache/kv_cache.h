// Paged KV storage: per attention layer a K and a V pool of
// [num_blocks, block_size, kv_heads, head_dim]. What the bytes mean is the model's business;
// which blocks a request owns is the cache manager's.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace revolta {

// What one attention layer needs per cached token. Layers with equal specs share a block pool.
struct KvCacheSpec {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
  int64_t bytes_per_token() const {
    return int64_t(2) * num_layers * num_kv_heads * head_dim * int64_t(dtype_size(dtype));
  }
};

struct KvCache {
  KvCache(const KvCacheSpec& spec, int32_t num_blocks, int32_t block_size, Device device = Device::kCPU);
  std::vector<Tensor> k, v;  // one per layer
  int32_t num_blocks;
  int32_t block_size;
  int64_t nbytes() const;
};

}  // namespace revolta
