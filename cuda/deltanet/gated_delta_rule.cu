// Gated DeltaNet pieces on the device (the CPU ops' contracts, ops/cpu/gated_delta_rule.cpp).
//
// gated_delta_rule, recurrent form: a block per (value head, 32 state columns, sequence); lane j
// owns column j, the block's 4 warps split the Dk rows, so the fp32 state slice
// S[:, j] lives in registers (Dk / 4 values per thread) for the whole sequence and goes back to
// memory once. Per token: decay, S^T k (column sums: per thread over its rows, then over the warps
// through shared memory), the delta, the rank-1 update, S^T q. Batches of more than
// kRecurrentTokens tokens take the chunked tensor-core form (gdn_chunked.cuh) where it applies.
#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "deltanet/gdn_chunked.cuh"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int64_t kRecurrentTokens = 64;

template <int RPT>  // state rows per thread: Dk / kWarps
__global__ void __launch_bounds__(kWarps * 32) gdn_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k,
                                                                    const float* __restrict__ v, const float* __restrict__ g,
                                                                    const float* __restrict__ beta, float* __restrict__ states,
                                                                    const int32_t* __restrict__ starts,
                                                                    const int32_t* __restrict__ slots, float* __restrict__ out,
                                                                    int Hk, int Hv, int Dv) {
  constexpr int Dk = RPT * kWarps;
  __shared__ float ks[Dk], qs[Dk], red[kWarps][32];
  const int h = blockIdx.x, hk = h / (Hv / Hk), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = blockIdx.y * 32 + lane;
  const bool col = j < Dv;
  const int t0 = starts[blockIdx.z], t1 = starts[blockIdx.z + 1];
  if (slots[blockIdx.z] < 0) {  // a padding row of a captured decode batch: no state, zero output
    if (warp == 0 && col)
      for (int t = t0; t < t1; ++t) out[(size_t(t) * Hv + h) * Dv + j] = 0.0f;
    return;
  }
  float* S = states + (size_t(slots[blockIdx.z]) * Hv + h) * Dk * Dv;
  float s[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) s[r] = col ? S[size_t(warp * RPT + r) * Dv + j] : 0.0f;
  const float scale = rsqrtf(float(Dk));
  for (int t = t0; t < t1; ++t) {
    __syncthreads();  // the previous token's k / q are no longer read
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      ks[i] = k[(size_t(t) * Hk + hk) * Dk + i];
      qs[i] = q[(size_t(t) * Hk + hk) * Dk + i] * scale;
    }
    __syncthreads();
    const float decay = __expf(g[size_t(t) * Hv + h]), b = beta[size_t(t) * Hv + h];
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      s[r] *= decay;
      part += ks[warp * RPT + r] * s[r];
    }
    red[warp][lane] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) kv += red[w][lane];
    const float delta = col ? (v[(size_t(t) * Hv + h) * Dv + j] - kv) * b : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      s[r] += ks[warp * RPT + r] * delta;
      o += qs[warp * RPT + r] * s[r];
    }
    __syncthreads();  // everyone has read red
    red[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][lane];
      out[(size_t(t) * Hv + h) * Dv + j] = sum;
    }
  }
#pragma unroll
  for (int r = 0; r < RPT; ++r)
    if (col) S[size_t(warp * RPT + r) * Dv + j] = s[r];
}

// MaxW: the widest kernel it takes (8: the DeltaNet's convs; 32: Flash-Next's dilated PLE conv, run
// undilated with zero taps between).
template <int MaxW>
__global__ void causal_conv1d_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ states,
                                     const int32_t* __restrict__ starts, const int32_t* __restrict__ slots,
                                     float* __restrict__ out, int C, int X, int W, bool with_silu) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int t0 = starts[blockIdx.y], t1 = starts[blockIdx.y + 1];
  if (slots[blockIdx.y] < 0) {
    for (int t = t0; t < t1; ++t) out[size_t(t) * C + c] = 0.0f;
    return;
  }
  float* st = states + size_t(slots[blockIdx.y]) * C * (W - 1);
  float win[MaxW];  // the last W - 1 inputs, oldest first
  float wc[MaxW];
  for (int i = 0; i < W; ++i) wc[i] = w[size_t(c) * W + i];
  for (int i = 0; i < W - 1; ++i) win[i] = st[size_t(c) * (W - 1) + i];
  for (int t = t0; t < t1; ++t) {
    const float xt = x[size_t(t) * X + c];
    float acc = wc[W - 1] * xt;
    for (int i = 0; i < W - 1; ++i) acc += wc[i] * win[i];
    for (int i = 0; i + 1 < W - 1; ++i) win[i] = win[i + 1];
    if (W > 1) win[W - 2] = xt;
    out[size_t(t) * C + c] = with_silu ? silu(acc) : acc;
  }
  for (int i = 0; i < W - 1; ++i) st[size_t(c) * (W - 1) + i] = win[i];
}

__global__ void l2_norm_kernel(float* __restrict__ x, int64_t rows, int dim, float eps) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  float* p = x + r * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x % 32; i < dim; i += 32) ss += p[i] * p[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss + eps);
  for (int i = threadIdx.x % 32; i < dim; i += 32) p[i] *= inv;
}

// One warp per head of a token: q and k heads L2-normalised, v heads copied (grid: tokens x head
// groups of four).
__global__ void split_qkv_kernel(const float* __restrict__ mixed, int Hk, int Dk, int Hv, int Dv, float eps,
                                 float* __restrict__ q, float* __restrict__ k, float* __restrict__ v) {
  const int t = blockIdx.x, h = blockIdx.y * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (h >= 2 * Hk + Hv) return;
  const float* row = mixed + size_t(t) * (2 * Hk * Dk + Hv * Dv);
  if (h >= 2 * Hk) {
    const int hv = h - 2 * Hk;
    for (int i = lane; i < Dv; i += 32) v[(size_t(t) * Hv + hv) * Dv + i] = row[2 * Hk * Dk + hv * Dv + i];
    return;
  }
  const float* src = row + h * Dk;
  float ss = 0.0f;
  for (int i = lane; i < Dk; i += 32) ss += src[i] * src[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss + eps);
  float* dst = (h < Hk ? q + (size_t(t) * Hk + h) * Dk : k + (size_t(t) * Hk + h - Hk) * Dk);
  for (int i = lane; i < Dk; i += 32) dst[i] = src[i] * inv;
}

__global__ void gated_rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ gate, int64_t P, int64_t G,
                                      int64_t column, const float* __restrict__ w, float eps, int64_t rows, int n,
                                      float* __restrict__ out) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const float* xr = x + r * n;
  float ss = 0.0f;
  for (int i = threadIdx.x % 32; i < n; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(n) + eps);
  for (int i = threadIdx.x % 32; i < n; i += 32) {
    const float z = gate[(r * n / P) * G + column + (r * n) % P + i];
    out[r * n + i] = w[i] * (xr[i] * inv) * silu(z);
  }
}

}  // namespace

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out,
                      int32_t chunk_size) {
  const int64_t T = q.size(0), Hk = q.size(1), Dk = q.size(2), Hv = v.size(1), Dv = v.size(2), S = seq_slots.numel();
  RV_CHECK(Hv % Hk == 0 && states.numel() % (Hv * Dk * Dv) == 0, "CUDA gated_delta_rule: q ", q.shape_str(), " v ",
           v.shape_str(), " states ", states.shape_str());
  if (T == 0 || S == 0) return;
  // Decode batches (a few tokens per sequence) stay recurrent: a chunk would be mostly padding.
  if (chunk_size > 1 && T > kRecurrentTokens &&
      gdn_chunked::run(q, k, v, g, beta, states, seq_starts, seq_slots, out))
    return;
  const dim3 grid{unsigned(Hv), unsigned((Dv + 31) / 32), unsigned(S)};
  auto launch = [&](auto kernel) {
    kernel<<<grid, kWarps * 32, 0, stream()>>>(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(),
                                               beta.ptr<float>(), states.ptr<float>(), seq_starts.ptr<int32_t>(),
                                               seq_slots.ptr<int32_t>(), out.ptr<float>(), int(Hk), int(Hv), int(Dv));
  };
  switch (Dk) {
    case 16: launch(gdn_recurrent_kernel<4>); break;
    case 32: launch(gdn_recurrent_kernel<8>); break;
    case 64: launch(gdn_recurrent_kernel<16>); break;
    case 128: launch(gdn_recurrent_kernel<32>); break;
    case 256: launch(gdn_recurrent_kernel<64>); break;
    default: throw std::invalid_argument("CUDA gated_delta_rule: key head dim must be 16, 32, 64, 128 or 256");
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                   const Tensor& seq_slots, Tensor& out, bool silu) {
  const int64_t T = x.size(0), X = x.size(1), C = weight.size(0), W = weight.size(1), S = seq_slots.numel();
  RV_CHECK(W >= 1 && W <= ops::kCudaConvMaxWidth && X >= C && (W == 1 || conv_states.numel() % (C * (W - 1)) == 0),
           "CUDA causal_conv1d: x ", x.shape_str(), " weight ", weight.shape_str(), " (kernel width <= ", ops::kCudaConvMaxWidth, ")");
  if (T == 0 || S == 0) return;
  const dim3 grid{unsigned((C + 127) / 128), unsigned(S), 1u};
  const auto kernel = W <= 8 ? causal_conv1d_kernel<8> : causal_conv1d_kernel<int(ops::kCudaConvMaxWidth)>;
  kernel<<<grid, 128, 0, stream()>>>(x.ptr<float>(), weight.ptr<float>(), conv_states.ptr<float>(),
                                     seq_starts.ptr<int32_t>(), seq_slots.ptr<int32_t>(), out.ptr<float>(), int(C), int(X),
                                     int(W), silu);
  RV_CUDA_CHECK(cudaGetLastError());
}

void l2_norm(Tensor& x, int64_t dim, float eps) {
  const int64_t rows = x.numel() / dim;
  if (rows == 0) return;
  l2_norm_kernel<<<unsigned((rows + 3) / 4), 128, 0, stream()>>>(x.ptr<float>(), rows, int(dim), eps);
  RV_CUDA_CHECK(cudaGetLastError());
}

void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t T = mixed.size(0), Hk = q.size(1), Dk = q.size(2), Hv = v.size(1), Dv = v.size(2);
  RV_CHECK(mixed.size(1) == 2 * Hk * Dk + Hv * Dv, "CUDA gdn_split_qkv: mixed ", mixed.shape_str(), " q ",
           q.shape_str(), " v ", v.shape_str());
  if (T == 0) return;
  const dim3 grid{unsigned(T), unsigned((2 * Hk + Hv + kWarps - 1) / kWarps)};
  split_qkv_kernel<<<grid, kWarps * 32, 0, stream()>>>(mixed.ptr<float>(), int(Hk), int(Dk), int(Hv), int(Dv), eps,
                                                       q.ptr<float>(), k.ptr<float>(), v.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out) {
  const int64_t n = weight.numel(), rows = x.numel() / n, T = gate.size(0);
  if (rows == 0 || T == 0) return;
  const int64_t P = x.numel() / T, G = gate.numel() / T;
  RV_CHECK(weight.dtype() == DType::kF32 && x.numel() == T * P && P % n == 0 && gate_column + P <= G,
           "CUDA gated_rms_norm: float32 weight, x ", x.shape_str(), " gate ", gate.shape_str(), " from column ",
           gate_column);
  gated_rms_norm_kernel<<<unsigned((rows + 3) / 4), 128, 0, stream()>>>(x.ptr<float>(), gate.ptr<float>(), P, G,
                                                                          gate_column, weight.ptr<float>(), eps, rows,
                                                                          int(n), out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
