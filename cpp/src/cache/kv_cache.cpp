#include "cache/kv_cache.h"

namespace revolta {

KvCache::KvCache(const KvCacheSpec& spec, int32_t nb, int32_t bs, Device device) : num_blocks(nb), block_size(bs) {
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    k.push_back(Tensor::empty({nb, bs, spec.num_kv_heads, spec.head_dim}, spec.dtype, device));
    v.push_back(Tensor::empty({nb, bs, spec.num_kv_heads, spec.head_dim}, spec.dtype, device));
  }
}

int64_t KvCache::nbytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k.size(); ++i) n += int64_t(k[i].nbytes() + v[i].nbytes());
  return n;
}

}  // namespace revolta
