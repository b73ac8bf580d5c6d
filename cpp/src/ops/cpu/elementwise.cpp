// Row-wise ops: embedding gather, RMSNorm (plain and with the residual add fused), SwiGLU, RoPE.
// Norms follow the reference order: sum of squares in float32, then
// rsqrt(mean + eps), then multiply by the weight.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"
#include "quant/gguf_blocks.h"

namespace revolta::ops::cpu {
namespace {

// Widens a norm weight to f32 once per call (weights may be stored f16/bf16).
std::vector<float> weight_f32(const Tensor& w) {
  std::vector<float> out(size_t(w.numel()));
  convert_to_f32(w.data(), w.dtype(), out.data(), out.size());
  return out;
}

void rms_row(const float* x, const float* w, float eps, int64_t n, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const NormInto* norm) {
  const int64_t T = ids.numel(), H = table.size(1), V = table.size(0);
  RV_CHECK(out.numel() == T * H, "embedding: out ", out.shape_str());
  const int32_t* id = ids.ptr<int32_t>();
  const size_t row_bytes = size_t(dtype_bytes(table.dtype(), H));
  for (int64_t t = 0; t < T; ++t) {
    RV_CHECK(id[t] >= 0 && id[t] < V, "embedding: token id ", id[t], " outside vocab of ", V);
    const char* row = static_cast<const char*>(table.data()) + size_t(id[t]) * row_bytes;
    if (is_block_dtype(table.dtype())) dequantize(table.dtype(), row, out.ptr<float>() + t * H, H);
    else convert_to_f32(row, table.dtype(), out.ptr<float>() + t * H, size_t(H));
  }
  if (norm) rms_norm(out, *norm->weight, norm->eps, *norm->normed);
}

void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
  const int64_t T = ids.numel(), H = table.size(1), V = table.size(0);
  const int32_t* id = ids.ptr<int32_t>();
  const size_t row_bytes = size_t(dtype_bytes(table.dtype(), H));
  for (int64_t t = 0; t < T; ++t) {
    float* o = out.ptr<float>() + t * H;
    const int64_t local = int64_t(id[t]) - first_id;
    if (local < 0 || local >= V) {
      std::fill(o, o + H, 0.0f);
      continue;
    }
    const char* row = static_cast<const char*>(table.data()) + size_t(local) * row_bytes;
    if (is_block_dtype(table.dtype())) dequantize(table.dtype(), row, o, H);
    else convert_to_f32(row, table.dtype(), o, size_t(H));
  }
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t n = weight.numel(), rows = x.numel() / n;
  auto w = weight_f32(weight);
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r) rms_row(xp + r * n, w.data(), eps, n, op + r * n);
}

void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor& out) {
  const int64_t n = weight.numel(), rows = x.numel() / n;
  auto w = weight_f32(weight);
  float* rp = residual.ptr<float>();
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  for (int64_t i = 0; i < rows * n; ++i) rp[i] += xp[i];
  for (int64_t r = 0; r < rows; ++r) rms_row(rp + r * n, w.data(), eps, n, op + r * n);
}

void silu_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t I = out.size(-1), rows = out.numel() / I;
  RV_CHECK(gate_up.numel() == rows * 2 * I, "silu_mul: gate_up ", gate_up.shape_str());
  const float* g = gate_up.ptr<float>();
  float* o = out.ptr<float>();
  parallel_range(rows * I, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t r = i / I, c = i % I;
      float a = g[r * 2 * I + c], u = g[r * 2 * I + I + c];
      o[i] = a / (1.0f + std::exp(-a)) * u;
    }
  });
}

void rope(Tensor& x, const Tensor& positions, const RopeTables& tables) {
  const int64_t T = x.size(0), heads = x.size(1), D = x.size(2);
  const int64_t half = tables.rotary_dim / 2, max_pos = tables.cos.size(0);
  const int32_t* pos = positions.ptr<int32_t>();
  const int32_t* axes = tables.axes.defined() ? tables.axes.ptr<int32_t>() : nullptr;
  const int64_t A = axes ? positions.size(1) : 1;
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  float* xp = x.ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const int32_t p = pos[t * A + (axes ? axes[i] : 0)];
      RV_CHECK(p >= 0 && p < max_pos, "rope: position ", p, " beyond ", max_pos);
      c[size_t(i)] = tables.cos.ptr<float>()[int64_t(p) * half + i];
      s[size_t(i)] = tables.sin.ptr<float>()[int64_t(p) * half + i];
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xp + (t * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[size_t(i)] - x2 * s[size_t(i)];
        v[i + half] = x2 * c[size_t(i)] + x1 * s[size_t(i)];
      }
    }
  }
}

// The group scales applied to a copy of x, then the linear layer.
void linear_scaled(const Tensor& x, const GroupScale& scale, const Tensor& weight, Tensor& out) {
  const Tensor& sq = *scale.squares;
  const int64_t T = x.size(0), K = x.size(1), groups = sq.size(1), parts = sq.size(2), G = K / groups;
  Tensor scaled = Tensor::uninitialized({T, K}, DType::kF32);
  const float* xp = x.ptr<float>();
  const float* sp = sq.ptr<float>();
  float* dp = scaled.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t p = 0; p < parts; ++p) sum += sp[(t * groups + g) * parts + p];
      const float inv = 1.0f / std::sqrt(sum / float(G) + scale.eps);
      for (int64_t i = g * G; i < (g + 1) * G; ++i) dp[t * K + i] = xp[t * K + i] * inv;
    }
  cpu::linear(scaled, weight, nullptr, out);
}

void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act) {
  const int64_t K = gate_up_weight.size(1), M = x.numel() / K;
  Tensor gu = Tensor::uninitialized({M, gate_up_weight.size(0)}, DType::kF32);
  cpu::linear(x, gate_up_weight, nullptr, gu);
  cpu::silu_mul(gu, act);
}

}  // namespace revolta::ops::cpu
