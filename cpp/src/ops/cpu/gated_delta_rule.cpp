// The gated delta rule (Gated DeltaNet linear attention) for one sequence, per value head h:
//
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T      S: [Dk, Dv]
//   o_t = S_t^T (q_t / sqrt(Dk))
//
// Two forms with the same result: the recurrent one (a token at a time, for decode) and the
// chunked one (for prefill): within a chunk of C tokens the updates are folded into a unit lower
// triangular system (the WY / UT representation), solved by forward substitution, so the state
// is touched once per chunk instead of once per token. The state stays float32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {
namespace {

struct GdnShape {
  int64_t T, Hk, Hv, Dk, Dv;
};

GdnShape check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      const Tensor& state, const Tensor& out) {
  GdnShape s{q.size(0), q.size(1), v.size(1), q.size(2), v.size(2)};
  RV_CHECK(k.shape() == q.shape() && v.size(0) == s.T && g.numel() == s.T * s.Hv && beta.numel() == s.T * s.Hv,
           "gated_delta_rule: q ", q.shape_str(), " k ", k.shape_str(), " v ", v.shape_str(), " g ", g.shape_str());
  RV_CHECK(s.Hv % s.Hk == 0, "gated_delta_rule: value heads (", s.Hv, ") must be a multiple of key heads (", s.Hk, ")");
  RV_CHECK(state.numel() == s.Hv * s.Dk * s.Dv && out.numel() == s.T * s.Hv * s.Dv,
           "gated_delta_rule: state ", state.shape_str(), " out ", out.shape_str());
  return s;
}

void recurrent_head(const GdnShape& s, int64_t h, const float* q, const float* k, const float* v, const float* g,
                    const float* beta, float* S, float* out) {
  const int64_t hk = h / (s.Hv / s.Hk);
  const float scale = 1.0f / std::sqrt(float(s.Dk));
  std::vector<float> kv(size_t(s.Dv));
  for (int64_t t = 0; t < s.T; ++t) {
    const float* kt = k + (t * s.Hk + hk) * s.Dk;
    const float* qt = q + (t * s.Hk + hk) * s.Dk;
    const float* vt = v + (t * s.Hv + h) * s.Dv;
    const float decay = std::exp(g[t * s.Hv + h]), b = beta[t * s.Hv + h];
    for (int64_t i = 0; i < s.Dk * s.Dv; ++i) S[i] *= decay;
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < s.Dk; ++i) axpy_f32(kt[i], S + i * s.Dv, kv.data(), s.Dv);  // S^T k
    for (int64_t j = 0; j < s.Dv; ++j) kv[size_t(j)] = (vt[j] - kv[size_t(j)]) * b;     // delta
    for (int64_t i = 0; i < s.Dk; ++i) axpy_f32(kt[i], kv.data(), S + i * s.Dv, s.Dv);  // += k delta^T
    float* ot = out + (t * s.Hv + h) * s.Dv;
    std::fill(ot, ot + s.Dv, 0.0f);
    for (int64_t i = 0; i < s.Dk; ++i) axpy_f32(qt[i] * scale, S + i * s.Dv, ot, s.Dv);
  }
}

void chunked_head(const GdnShape& s, int64_t h, int64_t C, const float* q, const float* k, const float* v,
                  const float* g, const float* beta, float* S, float* out) {
  const int64_t hk = h / (s.Hv / s.Hk), Dk = s.Dk, Dv = s.Dv;
  const float scale = 1.0f / std::sqrt(float(Dk));
  std::vector<float> cum(static_cast<size_t>(C)), U(static_cast<size_t>(C * Dv)), W(static_cast<size_t>(C * Dk)),
      kk(static_cast<size_t>(C * C));
  auto K = [&](int64_t t) { return k + (t * s.Hk + hk) * Dk; };
  auto Q = [&](int64_t t) { return q + (t * s.Hk + hk) * Dk; };
  for (int64_t t0 = 0; t0 < s.T; t0 += C) {
    const int64_t n = std::min(C, s.T - t0);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) cum[size_t(i)] = acc += g[(t0 + i) * s.Hv + h];
    // k_i . k_j for j <= i, shared by the system and the state update
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j) kk[size_t(i * C + j)] = dot_f32(K(t0 + i), K(t0 + j), Dk);
    // (I + A) X = B with A[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j), j < i;
    // X = [U | W] for B = [beta v | beta k exp(cum)]
    for (int64_t i = 0; i < n; ++i) {
      const float b = beta[(t0 + i) * s.Hv + h];
      float* u = U.data() + i * Dv;
      float* w = W.data() + i * Dk;
      const float* vi = v + ((t0 + i) * s.Hv + h) * Dv;
      const float ec = std::exp(cum[size_t(i)]);
      for (int64_t d = 0; d < Dv; ++d) u[d] = b * vi[d];
      for (int64_t d = 0; d < Dk; ++d) w[d] = b * K(t0 + i)[d] * ec;
      for (int64_t j = 0; j < i; ++j) {
        const float a = b * kk[size_t(i * C + j)] * std::exp(cum[size_t(i)] - cum[size_t(j)]);
        axpy_f32(-a, U.data() + j * Dv, u, Dv);
        axpy_f32(-a, W.data() + j * Dk, w, Dk);
      }
    }
    // v_new = U - W S  (the part of the values the state does not already predict)
    for (int64_t i = 0; i < n; ++i) {
      float* u = U.data() + i * Dv;
      const float* w = W.data() + i * Dk;
      for (int64_t d = 0; d < Dk; ++d) axpy_f32(-w[d], S + d * Dv, u, Dv);
    }
    // outputs: exp(cum_i) q_i S + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) v_new_j
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + ((t0 + i) * s.Hv + h) * Dv;
      std::fill(o, o + Dv, 0.0f);
      const float* qi = Q(t0 + i);
      const float ec = std::exp(cum[size_t(i)]) * scale;
      for (int64_t d = 0; d < Dk; ++d) axpy_f32(qi[d] * ec, S + d * Dv, o, Dv);
      for (int64_t j = 0; j <= i; ++j) {
        const float a = dot_f32(qi, K(t0 + j), Dk) * scale * std::exp(cum[size_t(i)] - cum[size_t(j)]);
        axpy_f32(a, U.data() + j * Dv, o, Dv);
      }
    }
    // S = exp(cum_last) S + sum_j exp(cum_last - cum_j) k_j v_new_j^T
    const float last = cum[size_t(n - 1)];
    const float el = std::exp(last);
    for (int64_t i = 0; i < Dk * Dv; ++i) S[i] *= el;
    for (int64_t j = 0; j < n; ++j) {
      const float e = std::exp(last - cum[size_t(j)]);
      const float* kj = K(t0 + j);
      const float* u = U.data() + j * Dv;
      for (int64_t d = 0; d < Dk; ++d) axpy_f32(kj[d] * e, u, S + d * Dv, Dv);
    }
  }
}

}  // namespace

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, Tensor& out, int32_t chunk_size) {
  const GdnShape s = check_shapes(q, k, v, g, beta, state, out);
  parallel_tasks(s.Hv, [&](int64_t h) {
    float* S = state.ptr<float>() + h * s.Dk * s.Dv;
    if (chunk_size <= 1)
      recurrent_head(s, h, q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(), beta.ptr<float>(), S,
                     out.ptr<float>());
    else
      chunked_head(s, h, chunk_size, q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(),
                   beta.ptr<float>(), S, out.ptr<float>());
  });
}

void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_state, Tensor& out, bool silu) {
  // x: [T, X >= C], channels its first C columns; weight: [C, W]; conv_state: [C, W - 1] (the
  // previous W - 1 inputs, oldest first).
  const int64_t T = x.size(0), X = x.size(1), C = weight.size(0), W = weight.size(1);
  RV_CHECK(X >= C && conv_state.numel() == C * (W - 1) && out.numel() == T * C,
           "causal_conv1d: x ", x.shape_str(), " weight ", weight.shape_str(), " state ", conv_state.shape_str());
  const float* xp = x.ptr<float>();
  const float* wp = weight.ptr<float>();
  float* st = conv_state.ptr<float>();
  float* op = out.ptr<float>();
  parallel_range(C, 64, [&](int64_t c0, int64_t c1) {
    std::vector<float> window(size_t(W - 1 + T));
    for (int64_t c = c0; c < c1; ++c) {
      for (int64_t i = 0; i < W - 1; ++i) window[size_t(i)] = st[c * (W - 1) + i];
      for (int64_t t = 0; t < T; ++t) window[size_t(W - 1 + t)] = xp[t * X + c];
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < W; ++j) acc += wp[c * W + j] * window[size_t(t + j)];
        op[t * C + c] = silu ? acc / (1.0f + std::exp(-acc)) : acc;
      }
      for (int64_t i = 0; i < W - 1; ++i) st[c * (W - 1) + i] = window[size_t(T + i)];
    }
  });
}

void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t T = mixed.size(0), key_dim = q.numel() / std::max<int64_t>(T, 1), value_dim = v.numel() / std::max<int64_t>(T, 1);
  RV_CHECK(mixed.size(1) == 2 * key_dim + value_dim, "gdn_split_qkv: mixed ", mixed.shape_str(), " q ", q.shape_str(),
           " v ", v.shape_str());
  Tensor q2 = q.view({T, key_dim}), k2 = k.view({T, key_dim}), v2 = v.view({T, value_dim});
  copy_columns(mixed, 0, q2);
  copy_columns(mixed, key_dim, k2);
  copy_columns(mixed, 2 * key_dim, v2);
  l2_norm(q, q.size(2), eps);
  l2_norm(k, k.size(2), eps);
}

void l2_norm(Tensor& x, int64_t dim, float eps) {
  const int64_t rows = x.numel() / dim;
  float* p = x.ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * dim;
    const float inv = 1.0f / std::sqrt(dot_f32(row, row, dim) + eps);
    for (int64_t i = 0; i < dim; ++i) row[i] *= inv;
  }
}

namespace {
// out = x * row_scale(r, x_r) * w * silu(z), row-wise over the last dimension of weight, z the
// row's gates (gate_column onwards of its token's row of gate).
template <typename RowScale>
void gate_rows(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, Tensor& out,
               RowScale row_scale) {
  const int64_t n = weight.numel(), rows = x.numel() / n, T = gate.size(0);
  const int64_t G = T ? gate.numel() / T : 0, P = T ? x.numel() / T : 0;
  RV_CHECK(T == 0 || (x.numel() == T * P && P % n == 0 && gate_column + P <= G), "gated_rms_norm: x ", x.shape_str(),
           " gate ", gate.shape_str(), " from column ", gate_column);
  std::vector<float> w(static_cast<size_t>(n));
  convert_to_f32(weight.data(), weight.dtype(), w.data(), size_t(n));
  const float* xp = x.ptr<float>();
  const float* gp = gate.ptr<float>();
  float* op = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * n;
    const float inv = row_scale(r, xr);
    const float* zr = gp + (r * n / P) * G + gate_column + (r * n) % P;  // this row's gates
    for (int64_t i = 0; i < n; ++i) {
      const float z = zr[i];
      op[r * n + i] = w[size_t(i)] * (xr[i] * inv) * (z / (1.0f + std::exp(-z)));
    }
  }
}
}  // namespace

void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps,
                    Tensor& out) {
  const int64_t n = weight.numel();
  gate_rows(x, gate, gate_column, weight, out,
            [&](int64_t, const float* xr) { return 1.0f / std::sqrt(dot_f32(xr, xr, n) / float(n) + eps); });
}

namespace {
// gated_rms_norm's gating without its RMS (ops::gdn_decode's squares): out = x * w * silu(z) and
// squares[r, p] = the sum of x's squares over columns [32 p, 32 p + 32) of row r of x [rows, n].
void gated_unscaled(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, Tensor& squares,
                    Tensor& out) {
  const int64_t n = weight.numel(), parts = (n + 31) / 32;
  float* sp = squares.ptr<float>();
  gate_rows(x, gate, gate_column, weight, out, [&](int64_t r, const float* xr) {
    for (int64_t p = 0; p < parts; ++p) sp[r * parts + p] = dot_f32(xr + 32 * p, xr + 32 * p, std::min<int64_t>(32, n - 32 * p));
    return 1.0f;
  });
}

// Slot `slot` of a [slots, ...] state tensor as a tensor of the remaining dimensions.
Tensor slot_of(const Tensor& states, int32_t slot) {
  std::vector<int64_t> shape(states.shape().begin() + 1, states.shape().end());
  return states.slice_rows(slot, slot + 1).view(shape);
}
}  // namespace

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out,
                      int32_t chunk_size) {
  const int32_t* st = seq_starts.ptr<int32_t>();
  for (int64_t s = 0; s < seq_slots.numel(); ++s) {
    const int64_t t0 = st[s], t1 = st[s + 1];
    if (t1 == t0) continue;
    Tensor o = out.slice_rows(t0, t1);
    if (seq_slots.ptr<int32_t>()[s] < 0) {  // a padding row: no state, zero output
      std::fill(o.ptr<float>(), o.ptr<float>() + o.numel(), 0.0f);
      continue;
    }
    Tensor state = slot_of(states, seq_slots.ptr<int32_t>()[s]);
    gated_delta_rule(q.slice_rows(t0, t1), k.slice_rows(t0, t1), v.slice_rows(t0, t1), g.slice_rows(t0, t1),
                     beta.slice_rows(t0, t1), state, o, t1 - t0 > 1 ? chunk_size : 1);
  }
}

void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                   const Tensor& seq_slots, Tensor& out, bool silu) {
  const int32_t* st = seq_starts.ptr<int32_t>();
  for (int64_t s = 0; s < seq_slots.numel(); ++s) {
    const int64_t t0 = st[s], t1 = st[s + 1];
    if (t1 == t0) continue;
    Tensor o = out.slice_rows(t0, t1);
    if (seq_slots.ptr<int32_t>()[s] < 0) {
      std::fill(o.ptr<float>(), o.ptr<float>() + o.numel(), 0.0f);
      continue;
    }
    Tensor state = slot_of(conv_states, seq_slots.ptr<int32_t>()[s]);
    causal_conv1d(x.slice_rows(t0, t1), weight, state, o, silu);
  }
}

// The decode composition of the DeltaNet ops (the contract in ops/ops.h).
void gdn_decode(const Tensor* x, Tensor& fused, const GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares) {
  if (x) linear(*x, *w.proj, nullptr, fused);
  const int64_t T = fused.size(0), Hv = w.neg_a->numel(), Dv = w.norm->numel(), Dk = states.size(2);
  const int64_t C = w.conv->size(0), Hk = (C - Hv * Dv) / (2 * Dk);
  RV_CHECK(Hk > 0 && C == 2 * Hk * Dk + Hv * Dv && fused.size(1) >= C + Hv * Dv + 2 * Hv, "gdn_decode: fused ",
           fused.shape_str(), " conv ", w.conv->shape_str(), " states ", states.shape_str());
  Tensor conv_out = Tensor::uninitialized({T, C}, DType::kF32), q = Tensor::uninitialized({T, Hk, Dk}, DType::kF32);
  Tensor k = Tensor::uninitialized({T, Hk, Dk}, DType::kF32), v = Tensor::uninitialized({T, Hv, Dv}, DType::kF32);
  Tensor g = Tensor::uninitialized({T, Hv}, DType::kF32), beta = Tensor::uninitialized({T, Hv}, DType::kF32);
  Tensor core = Tensor::uninitialized({T, Hv, Dv}, DType::kF32);
  causal_conv1d(fused, *w.conv, conv_states, seq_starts, seq_slots, conv_out, true);
  gdn_split_qkv(conv_out, 1e-6f, q, k, v);
  gdn_gates(fused, C + Hv * Dv, *w.neg_a, *w.dt_bias, beta, g);
  gated_delta_rule(q, k, v, g, beta, states, seq_starts, seq_slots, core, 64);
  if (squares) gated_unscaled(core, fused, C, *w.norm, *squares, out);
  else gated_rms_norm(core, fused, C, *w.norm, w.norm_eps, out);
}

}  // namespace revolta::ops::cpu
