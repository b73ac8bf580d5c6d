// The vision encoder's own ops on the CPU: LayerNorm, GELU, row scatter and bidirectional attention
// over packed sequences (one per image or video frame), the last as two GEMMs per head and tile of
// queries, so a frame of thousands of patches runs at the CPU GEMM's speed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  const int64_t n = weight.numel(), rows = x.numel() / n;
  const float* w = weight.ptr<float>();
  const float* b = bias.ptr<float>();
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  parallel_range(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * n;
      float* o = op + r * n;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += xr[i];
      const float mean = float(sum / double(n));
      double var = 0.0;
      for (int64_t i = 0; i < n; ++i) var += double(xr[i] - mean) * double(xr[i] - mean);
      const float inv = 1.0f / std::sqrt(float(var / double(n)) + eps);
      for (int64_t i = 0; i < n; ++i) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
    }
  });
}

void gelu(Tensor& x, bool tanh_approximation) {
  float* p = x.ptr<float>();
  parallel_range(x.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = p[i];
      if (tanh_approximation) {
        const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
        p[i] = 0.5f * v * (1.0f + std::tanh(inner));
      } else {
        p[i] = 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
      }
    }
  });
}

void scatter_rows(Tensor& out, const Tensor& rows, const Tensor& src) {
  const int64_t R = rows.numel(), C = out.size(1), T = out.size(0);
  const int32_t* r = rows.ptr<int32_t>();
  for (int64_t i = 0; i < R; ++i) {
    RV_CHECK(r[i] >= 0 && r[i] < T, "scatter_rows: row ", r[i], " outside [0, ", T, ")");
    std::copy_n(src.ptr<float>() + i * C, C, out.ptr<float>() + int64_t(r[i]) * C);
  }
}

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts, int32_t,
                      float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), S = seq_starts.numel() - 1;
  const int32_t* st = seq_starts.ptr<int32_t>();
  RV_CHECK(st[0] == 0 && st[S] == T, "varlen_attention: sequences cover rows [", st[0], ", ", st[S], "), not [0, ", T, ")");
  constexpr int64_t kTile = 256;  // query rows a pass: the score tile is kTile x n floats
  // Per (sequence, head): packed K [n, D] and V^T [D, n]; per query tile S = Q K^T and O = P V
  // through the CPU GEMM (cpu::linear), which spreads each product over the threads.
  const float* qp = q.ptr<float>();
  const float* kp = k.ptr<float>();
  const float* vp = v.ptr<float>();
  float* op = out.ptr<float>();
  for (int64_t s = 0; s < S; ++s) {
    const int64_t j0 = st[s], n = st[s + 1] - st[s];
    RV_CHECK(n >= 0, "varlen_attention: seq_starts decrease at ", s);
    if (n == 0) continue;
    Tensor kh = Tensor::uninitialized({n, D}, DType::kF32), vt = Tensor::uninitialized({D, n}, DType::kF32);
    Tensor qt = Tensor::uninitialized({std::min(kTile, n), D}, DType::kF32);
    Tensor scores = Tensor::uninitialized({std::min(kTile, n), n}, DType::kF32);
    Tensor o = Tensor::uninitialized({std::min(kTile, n), D}, DType::kF32);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < n; ++j) {
        std::copy_n(kp + ((j0 + j) * H + h) * D, D, kh.ptr<float>() + j * D);
        for (int64_t d = 0; d < D; ++d) vt.ptr<float>()[d * n + j] = vp[((j0 + j) * H + h) * D + d];
      }
      for (int64_t r0 = 0; r0 < n; r0 += kTile) {
        const int64_t m = std::min(kTile, n - r0);
        Tensor qm = qt.slice_rows(0, m), sm = scores.slice_rows(0, m), om = o.slice_rows(0, m);
        for (int64_t r = 0; r < m; ++r) std::copy_n(qp + ((j0 + r0 + r) * H + h) * D, D, qm.ptr<float>() + r * D);
        cpu::linear(qm, kh, nullptr, sm);
        parallel_range(m, 8, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r) {
            float* row = sm.ptr<float>() + r * n;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j] *= scale);
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          }
        });
        cpu::linear(sm, vt, nullptr, om);
        for (int64_t r = 0; r < m; ++r) std::copy_n(om.ptr<float>() + r * D, D, op + ((j0 + r0 + r) * H + h) * D);
      }
    }
  }
}

}  // namespace revolta::ops::cpu
