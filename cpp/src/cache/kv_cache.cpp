#include "cache/kv_cache.h"

namespace revolta {

KvCache::KvCache(const KvCacheSpec& spec, int32_t nb, int32_t bs, Device device, const TokenRowsSpec& r)
    : num_blocks(nb), block_size(bs) {
  for (int32_t l = 0; l < r.num_layers; ++l) rows.push_back(Tensor::empty({nb, bs, r.width}, DType::kF32, device));
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    k.push_back(Tensor::empty({nb, bs, spec.num_kv_heads, spec.head_dim}, spec.dtype, device));
    v.push_back(Tensor::empty({nb, bs, spec.num_kv_heads, spec.head_dim}, spec.dtype, device));
    if (!spec.quantized()) continue;
    ops::KvQuant& q = quant.emplace_back();  // E4M3: scales 1 until the model sets its own
    if (spec.dtype != DType::kI8) continue;
    q.k_rows = Tensor::empty({nb, bs, spec.num_kv_heads}, DType::kF32, device);
    q.v_rows = Tensor::empty({nb, bs, spec.num_kv_heads}, DType::kF32, device);
  }
}

int64_t KvCache::nbytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k.size(); ++i) n += int64_t(k[i].nbytes() + v[i].nbytes());
  for (const Tensor& t : rows) n += int64_t(t.nbytes());
  for (const ops::KvQuant& q : quant)
    if (q.k_rows.defined()) n += int64_t(q.k_rows.nbytes() + q.v_rows.nbytes());
  return n;
}

}  // namespace revolta
