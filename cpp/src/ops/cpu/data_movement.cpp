// Row gathers, column copies, random fills and argmax: the small ops that keep model code free
// of raw memory access, so the same forward runs on every device.
#include <cstring>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int64_t R = rows.numel(), C = out.numel() / std::max<int64_t>(R, 1), N = x.numel() / std::max<int64_t>(C, 1);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t src = rows.ptr<int32_t>()[r];
    RV_CHECK(src >= 0 && src < N, "gather_rows: row ", src, " out of range [0, ", N, ")");
    std::memcpy(out.ptr<float>() + r * C, x.ptr<float>() + int64_t(src) * C, size_t(C) * 4);
  }
}

void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst) {
  const int64_t T = src.size(0), SC = src.numel() / std::max<int64_t>(T, 1), DC = dst.numel() / std::max<int64_t>(T, 1);
  RV_CHECK(first_column + DC <= SC, "copy_columns: columns [", first_column, ", ", first_column + DC, ") of ", SC);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(dst.ptr<float>() + t * DC, src.ptr<float>() + t * SC + first_column, size_t(DC) * 4);
}

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi) {
  const int64_t n = t.numel();
  const DType dt = t.dtype();
  parallel_range(n, 1 << 16, [&](int64_t b, int64_t e) {
    float buf[256];
    for (int64_t i = b; i < e; i += 256) {
      const int64_t m = std::min<int64_t>(256, e - i);
      for (int64_t j = 0; j < m; ++j) buf[j] = lo + (hi - lo) * uniform_at(seed, uint64_t(i + j));
      convert_from_f32(buf, static_cast<char*>(t.data()) + i * int64_t(dtype_size(dt)), dt, size_t(m));
    }
  });
}

void argmax(const Tensor& x, Tensor& out) {
  const int64_t R = out.numel(), V = x.numel() / std::max<int64_t>(R, 1);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x.ptr<float>() + r * V;
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = int32_t(v);
    out.ptr<int32_t>()[r] = best;
  }
}

void qkv_rope_cache(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& tables,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  Tensor q2 = q.view({T, H * D});
  Tensor k = Tensor::uninitialized({T, KVH, D}, DType::kF32), v = Tensor::uninitialized({T, KVH, D}, DType::kF32);
  Tensor k2 = k.view({T, KVH * D}), v2 = v.view({T, KVH * D});
  cpu::copy_columns(qkv, 0, q2);
  cpu::copy_columns(qkv, H * D, k2);
  cpu::copy_columns(qkv, (H + KVH) * D, v2);
  if (norm.q) cpu::rms_norm(q, *norm.q, norm.eps, q);
  if (norm.k) cpu::rms_norm(k, *norm.k, norm.eps, k);
  cpu::rope(q, positions, tables);
  cpu::rope(k, positions, tables);
  cpu::kv_cache_write(k, v, slot_mapping, k_cache, v_cache);
}

void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act) {
  const int64_t K = gate_up_weight.size(1), M = x.numel() / K;
  Tensor gu = Tensor::uninitialized({M, gate_up_weight.size(0)}, DType::kF32);
  cpu::linear(x, gate_up_weight, nullptr, gu);
  cpu::silu_mul(gu, act);
}

}  // namespace revolta::ops::cpu
