// The vision encoder's own ops on the CPU: LayerNorm, GELU, row scatter and bidirectional attention
// over packed sequences (one per image or video frame). Attention work items are (query row, head);
// each keeps its scores for one sequence, whose length the image budget bounds.
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
  std::vector<int64_t> seq_of(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s) {
    RV_CHECK(st[s + 1] >= st[s], "varlen_attention: seq_starts decrease at ", s);
    for (int64_t t = st[s]; t < st[s + 1]; ++t) seq_of[size_t(t)] = s;
  }
  const float* qp = q.ptr<float>();
  const float* kp = k.ptr<float>();
  const float* vp = v.ptr<float>();
  float* op = out.ptr<float>();
  parallel_range(T * H, 4, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t item = b; item < e; ++item) {
      const int64_t t = item / H, h = item % H, s = seq_of[size_t(t)], j0 = st[s], j1 = st[s + 1];
      const float* qr = qp + (t * H + h) * D;
      scores.resize(size_t(j1 - j0));
      float mx = -INFINITY;
      for (int64_t j = j0; j < j1; ++j) {
        const float sc = dot_f32(qr, kp + (j * H + h) * D, D) * scale;
        scores[size_t(j - j0)] = sc;
        mx = std::max(mx, sc);
      }
      float sum = 0.0f;
      for (float& sc : scores) sum += (sc = std::exp(sc - mx));
      float* o = op + (t * H + h) * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = j0; j < j1; ++j) axpy_f32(scores[size_t(j - j0)] / sum, vp + (j * H + h) * D, o, D);
    }
  });
}

}  // namespace revolta::ops::cpu
