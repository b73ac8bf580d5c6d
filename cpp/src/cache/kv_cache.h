// Paged KV storage: per attention layer a K and a V pool of
// [num_blocks, block_size, kv_heads, head_dim] (float32, float16, E4M3 or int8, the last two with
// their scales: ops::KvQuant). What the bytes mean is the model's business; which blocks a
// request owns is the cache manager's.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace revolta {

// What one attention layer needs per cached token. Layers with equal specs share a block pool.
struct KvCacheSpec {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;
  bool quantized() const { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }
  int64_t bytes_per_token() const {  // int8 rows carry a float32 scale per KV head
    const int64_t row = head_dim * int64_t(dtype_size(dtype)) + (dtype == DType::kI8 ? 4 : 0);
    return int64_t(2) * num_layers * num_kv_heads * row;
  }
};

// Float32 rows of `width` values per token for `num_layers` layers, kept in the same blocks as the
// K/V (so block tables, prefix hits and offload cover them): QSA's raw indexer keys.
struct TokenRowsSpec {
  int32_t num_layers = 0, width = 0;
  int64_t bytes_per_token() const { return int64_t(num_layers) * width * 4; }
};

struct KvCache {
  KvCache(const KvCacheSpec& spec, int32_t num_blocks, int32_t block_size, Device device = Device::kCPU,
          const TokenRowsSpec& rows = {});
  std::vector<Tensor> k, v;  // one per layer
  std::vector<Tensor> rows;  // TokenRowsSpec: [num_blocks, block_size, width] per layer
  std::vector<ops::KvQuant> quant;  // one per layer for E4M3 / int8 caches, none otherwise
  const ops::KvQuant* quant_of(size_t layer) const { return quant.empty() ? nullptr : &quant[layer]; }
  int32_t num_blocks;
  int32_t block_size;
  int64_t nbytes() const;
};

}  // namespace revolta
