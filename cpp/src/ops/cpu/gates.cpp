// Elementwise gates and the MoE combine (contracts in ops/ops.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {
namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column) {
  const int64_t T = gate.size(0), G = T ? gate.numel() / T : 0, P = T ? x.numel() / T : 0;
  RV_CHECK(T == 0 || (x.numel() == T * P && gate_column + P <= G), "sigmoid_mul: x ", x.shape_str(), " gate ",
           gate.shape_str(), " from column ", gate_column);
  float* p = x.ptr<float>();
  const float* g = gate.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < P; ++j) p[t * P + j] *= sigmoid(g[t * G + gate_column + j]);
}

void gdn_gates(const Tensor& fused, int64_t first, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta, Tensor& g) {
  const int64_t T = fused.size(0), width = fused.numel() / std::max<int64_t>(T, 1), Hv = neg_a.numel();
  for (int64_t t = 0; t < T; ++t) {
    const float* row = fused.ptr<float>() + t * width + first;
    for (int64_t h = 0; h < Hv; ++h) {
      beta.ptr<float>()[t * Hv + h] = sigmoid(row[h]);
      g.ptr<float>()[t * Hv + h] = neg_a.ptr<float>()[h] * softplus(row[Hv + h] + dt_bias.ptr<float>()[h]);
    }
  }
}

void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y) {
  const int64_t n = rows.numel(), H = y.numel() / std::max<int64_t>(n, 1);
  for (int64_t i = 0; i < n; ++i) {
    float* o = out.ptr<float>() + int64_t(rows.ptr<int32_t>()[i]) * H;
    const float* yi = y.ptr<float>() + i * H;
    const float w = weights.ptr<float>()[i];
    for (int64_t d = 0; d < H; ++d) o[d] += w * yi[d];
  }
}

void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate) {
  const int64_t T = gate.numel(), H = out.numel() / std::max<int64_t>(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    const float s = sigmoid(gate.ptr<float>()[t]);
    for (int64_t d = 0; d < H; ++d) out.ptr<float>()[t * H + d] += s * y.ptr<float>()[t * H + d];
  }
}

void moe_topk(const Tensor& logits, int64_t E, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), LS = logits.size(1), S = LS - E, KS = ids.size(1), K = KS - S;
  RV_CHECK((S == 0 || S == 1) && K >= 1 && K <= E, "moe_topk: logits ", logits.shape_str(), " for ", E, " experts, ids ",
           ids.shape_str());
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.ptr<float>() + t * LS;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    for (auto& v : p) v /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float top = 0.0f;
    for (int64_t k = 0; k < K; ++k) top += p[size_t(idx[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      ids.ptr<int32_t>()[t * KS + k] = idx[size_t(k)];
      weights.ptr<float>()[t * KS + k] = renormalize ? p[size_t(idx[size_t(k)])] / top : p[size_t(idx[size_t(k)])];
    }
    if (S) ids.ptr<int32_t>()[t * KS + K] = int32_t(E), weights.ptr<float>()[t * KS + K] = sigmoid(l[E]);
  }
}

void moe_route(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, Tensor& ids, Tensor& weights,
               const ResidualNorm* first) {
  if (first) cpu::add_rms_norm(*first->residual, x, *first->weight, first->eps, *first->normed);
  Tensor logits = Tensor::uninitialized({x.size(0), router.size(0)}, DType::kF32);
  cpu::linear(first ? *first->normed : x, router, nullptr, logits);
  cpu::moe_topk(logits, E, renormalize, ids, weights);
}

// Each (token, slot) pair through its expert as 1-row linears on views of the expert's matrices.
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& ex, Tensor& out,
                 const ResidualNorm* then) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter;
  RV_CHECK(!ex.down_transposed, "CPU moe_experts: down matrices as [hidden, inter] (the table has them transposed)");
  const int64_t* gu_at = ex.gate_up.ptr<int64_t>();
  const int64_t* dn_at = ex.down.ptr<int64_t>();
  auto view = [&](int64_t address, std::vector<int64_t> shape) {
    return Tensor::wrap(reinterpret_cast<void*>(address), std::move(shape), ex.dtype, nullptr);
  };
  Tensor gu = Tensor::uninitialized({1, 2 * I}, DType::kF32), act = Tensor::uninitialized({1, I}, DType::kF32);
  Tensor y = Tensor::uninitialized({1, H}, DType::kF32);
  std::fill(out.ptr<float>(), out.ptr<float>() + T * H, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const Tensor xt = x.slice_rows(t, t + 1);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids.ptr<int32_t>()[t * K + k];
      if (gu_at[e] == 0) continue;  // held by another rank
      cpu::linear(xt, view(gu_at[e], {2 * I, H}), nullptr, gu);
      cpu::silu_mul(gu, act);
      cpu::linear(act, view(dn_at[e], {H, I}), nullptr, y);
      const float w = weights.ptr<float>()[t * K + k];
      float* o = out.ptr<float>() + t * H;
      for (int64_t d = 0; d < H; ++d) o[d] += w * y.ptr<float>()[d];
    }
  }
  if (then) cpu::add_rms_norm(*then->residual, out, *then->weight, then->eps, *then->normed);
}

void moe_route_experts(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, const ResidualNorm& first,
                       Tensor& ids, Tensor& weights, const ExpertTable& experts, Tensor& out, const ResidualNorm* then,
                       const Tensor* /*warm: no cache to warm*/) {
  cpu::moe_route(x, router, E, renormalize, ids, weights, &first);
  cpu::moe_experts(*first.normed, ids, weights, experts, out, then);
}

}  // namespace revolta::ops::cpu
