// The chunked gated delta rule on tensor cores (prefill), the WY form of the CPU's chunked_head
// (ops/cpu/gated_delta_rule.cpp). Chunks of C = 64 tokens per sequence, D = Dk = Dv.
//
//  1. prepare, in parallel over every (chunk, value head): with gamma = the cumulative gate,
//     A[i][j] = beta_i (k_i . k_j) e^(gamma_i - gamma_j) (j < i) and T = (I + A)^-1 (forward
//     substitution in shared memory), it writes W = T (beta k e^gamma), U = T (beta v), the
//     intra-chunk scores P[i][j] = scale (q_i . k_j) e^(gamma_i - gamma_j) (j <= i), q e^gamma scale,
//     k e^(gamma_last - gamma) and e^gamma_last to a scratch laid out per chunk;
//  2. scan, per (value head, 64 state columns, sequence), chunk after chunk with the fp32 state
//     in shared memory: v' = U - W S, o = (q e^gamma scale) S + P v', S = e^gamma_last S + (k e^(..))^T v'.
// Every product is an m16n16k16 WMMA tile (f16 operands, f32 accumulators): the state and the
// running sums stay fp32, operands are rounded to f16 as the fp16 GEMMs round the weights.
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda::gdn_chunked {

using namespace nvcuda;
constexpr int C = 64, kThreads = 256, kWarps = kThreads / 32, BV = 64;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// acc += A . B over K in 16-deep steps; a and b address the tiles' k = 0 elements, and each
// fragment's layout gives its step along k.
template <class FA, class FB>
__device__ __forceinline__ void mma_k(Acc& acc, int K, const __half* a, int lda, const __half* b, int ldb) {
  constexpr bool a_row = std::is_same_v<FA, FragA>, b_row = std::is_same_v<FB, FragB>;
  for (int kk = 0; kk < K; kk += 16) {
    FA fa;
    FB fb;
    wmma::load_matrix_sync(fa, a + (a_row ? kk : kk * lda), lda);
    wmma::load_matrix_sync(fb, b + (b_row ? kk * ldb : kk), ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// Sequence s and chunk c of flat chunk id `id` (chunks numbered sequence after sequence).
__device__ inline bool locate(const int32_t* starts, int S, int id, int& s, int& c, int& first) {
  first = 0;
  for (s = 0; s < S; ++s) {
    const int n = (starts[s + 1] - starts[s] + C - 1) / C;
    if (id < first + n) {
      c = id - first;
      return true;
    }
    first += n;
  }
  return false;
}

struct Scratch {  // per (chunk id, value head): [C][D] W, Qg, Kd (f16), U (f32); [C][C] P; e^gamma_last
  __half *w, *qg, *kd, *p;
  float *u, *last;
};

template <int D>
constexpr size_t prepare_smem() {
  return 2 * size_t(C) * (D + 8) * 2 + 2 * size_t(C) * (C + 4) * 4 + size_t(C) * (C + 8) * 2 + kWarps * 256 * 4 + 2 * C * 4;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    prepare_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   const float* __restrict__ g, const float* __restrict__ beta, const int32_t* __restrict__ starts,
                   const int32_t* __restrict__ slots, int S, int Hk, int Hv, float scale, Scratch out) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LD = D + 8, LC = C + 4, LH = C + 8;
  __half* ks = reinterpret_cast<__half*>(smem);
  __half* qb = ks + C * LD;                               // q, then the right-hand sides B
  float* mat = reinterpret_cast<float*>(qb + C * LD);     // q k^T, then A
  float* tin = mat + C * LC;                              // T = (I + A)^-1
  __half* tinh = reinterpret_cast<__half*>(tin + C * LC);
  float* stage = reinterpret_cast<float*>(tinh + C * LH);  // a 16 x 16 tile per warp
  float* gam = stage + kWarps * 256;
  float* bet = gam + C;
  const int h = blockIdx.y, hk = h / (Hv / Hk), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int s, c, first;
  if (!locate(starts, S, blockIdx.x, s, c, first) || slots[s] < 0) return;
  const int t0 = starts[s] + c * C, n = min(C, starts[s + 1] - t0);
  const size_t base = size_t(blockIdx.x) * Hv + h;
  if (threadIdx.x == 0) {
    float acc = 0.0f;
    for (int i = 0; i < C; ++i) {
      if (i < n) acc += g[size_t(t0 + i) * Hv + h];
      gam[i] = acc;
      bet[i] = i < n ? beta[size_t(t0 + i) * Hv + h] : 0.0f;
    }
    out.last[base] = __expf(acc);
  }
  __syncthreads();
  const float glast = gam[C - 1];
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int i = e / D, d = e % D;
    const bool in = i < n;
    const float kv = in ? k[(size_t(t0 + i) * Hk + hk) * D + d] : 0.0f, qv = in ? q[(size_t(t0 + i) * Hk + hk) * D + d] : 0.0f;
    ks[i * LD + d] = __float2half(kv);
    qb[i * LD + d] = __float2half(qv);
    out.qg[base * C * D + e] = __float2half(qv * __expf(gam[i]) * scale);
    out.kd[base * C * D + e] = __float2half(kv * __expf(glast - gam[i]));
  }
  __syncthreads();
  // a [C x D] . b[C x D]^T into mat, 16 tiles over the warps
  auto gram = [&](const __half* a) {
    for (int tile = warp; tile < 16; tile += kWarps) {
      const int ti = tile / 4, tj = tile % 4;
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_k<FragA, FragBT>(acc, D, a + ti * 16 * LD, LD, ks + tj * 16 * LD, LD);
      wmma::store_matrix_sync(mat + ti * 16 * LC + tj * 16, acc, LC, wmma::mem_row_major);
    }
    __syncthreads();
  };
  gram(qb);
  for (int e = threadIdx.x; e < C * C; e += kThreads) {
    const int i = e / C, j = e % C;
    const float p = (j <= i && i < n) ? mat[i * LC + j] * scale * __expf(gam[i] - gam[j]) : 0.0f;
    out.p[base * C * C + e] = __float2half(p);
  }
  __syncthreads();
  gram(ks);
  for (int e = threadIdx.x; e < C * C; e += kThreads) {
    const int i = e / C, j = e % C;
    mat[i * LC + j] = j < i ? bet[i] * mat[i * LC + j] * __expf(gam[i] - gam[j]) : 0.0f;
    tin[i * LC + j] = i == j ? 1.0f : 0.0f;
  }
  __syncthreads();
  {  // forward substitution, row by row: T[i][j] = -sum_{j <= m < i} A[i][m] T[m][j]; 4 threads per column
    const int j = threadIdx.x / 4, part = threadIdx.x % 4;
    for (int i = 1; i < C; ++i) {
      float acc = 0.0f;
      for (int m = j + part; m < i; m += 4) acc += mat[i * LC + m] * tin[m * LC + j];
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (part == 0 && j < i) tin[i * LC + j] = -acc;
      __syncthreads();
    }
  }
  for (int e = threadIdx.x; e < C * C; e += kThreads) tinh[(e / C) * LH + e % C] = __float2half(tin[(e / C) * LC + e % C]);
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int i = e / D, d = e % D;
    qb[i * LD + d] = __float2half(bet[i] * __expf(gam[i]) * __half2float(ks[i * LD + d]));
  }
  __syncthreads();
  // X = T . B for the [C x D] right-hand side in qb: 32 tiles over the warps
  auto solve = [&](bool to_half, __half* dst16, float* dst32) {
    for (int tile = warp; tile < (C / 16) * (D / 16); tile += kWarps) {
      const int ti = tile / (D / 16), tj = tile % (D / 16);
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_k<FragA, FragB>(acc, C, tinh + ti * 16 * LH, LH, qb + tj * 16, LD);
      if (!to_half) {
        wmma::store_matrix_sync(dst32 + (ti * 16) * D + tj * 16, acc, D, wmma::mem_row_major);
        continue;
      }
      float* st = stage + warp * 256;
      wmma::store_matrix_sync(st, acc, 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) dst16[(ti * 16 + e / 16) * D + tj * 16 + e % 16] = __float2half(st[e]);
      __syncwarp();
    }
    __syncthreads();
  };
  solve(true, out.w + base * C * D, nullptr);
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int i = e / D, d = e % D;
    qb[i * LD + d] = __float2half(i < n ? bet[i] * v[(size_t(t0 + i) * Hv + h) * D + d] : 0.0f);
  }
  __syncthreads();
  solve(false, nullptr, out.u + base * C * D);
}

template <int D>
constexpr size_t scan_smem() {
  return size_t(D) * (BV + 4) * 4 + size_t(D) * (BV + 8) * 2 + size_t(C) * (BV + 4) * 4 + size_t(C) * (BV + 8) * 2;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    scan_kernel(const int32_t* __restrict__ starts, const int32_t* __restrict__ slots, int S, int Hv, Scratch in,
                float* __restrict__ states, float* __restrict__ out) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int LF = BV + 4, LH = BV + 8;
  float* sf = reinterpret_cast<float*>(smem);                  // the state block [D][BV], fp32
  __half* sh = reinterpret_cast<__half*>(sf + D * LF);          // its f16 copy (the operand)
  float* vf = reinterpret_cast<float*>(sh + D * LH);            // v' (then o) [C][BV]
  __half* vh = reinterpret_cast<__half*>(vf + C * LF);
  const int h = blockIdx.x, col0 = blockIdx.y * BV, s = blockIdx.z, warp = threadIdx.x / 32;
  const int T0 = starts[s], len = starts[s + 1] - T0, slot = slots[s];
  if (slot < 0) {
    for (int e = threadIdx.x; e < len * BV; e += kThreads) out[(size_t(T0 + e / BV) * Hv + h) * D + col0 + e % BV] = 0.0f;
    return;
  }
  int first = 0;
  for (int p = 0; p < s; ++p) first += (starts[p + 1] - starts[p] + C - 1) / C;
  float* st = states + (size_t(slot) * Hv + h) * D * D;
  for (int e = threadIdx.x; e < D * BV; e += kThreads) {
    const float x = st[size_t(e / BV) * D + col0 + e % BV];
    sf[(e / BV) * LF + e % BV] = x;
    sh[(e / BV) * LH + e % BV] = __float2half(x);
  }
  __syncthreads();
  const int chunks = (len + C - 1) / C;
  for (int c = 0; c < chunks; ++c) {
    const size_t base = size_t(first + c) * Hv + h;
    const __half* W = in.w + base * C * D;
    const __half* Qg = in.qg + base * C * D;
    const __half* Kd = in.kd + base * C * D;
    const __half* P = in.p + base * C * C;
    const float* U = in.u + base * C * D;
    const int n = min(C, len - c * C);
    // v' = U - W S: 16 tiles of [C x BV]
    for (int tile = warp; tile < 16; tile += kWarps) {
      const int ti = tile / 4, tj = tile % 4;
      Acc u, ws;
      wmma::load_matrix_sync(u, U + ti * 16 * D + col0 + tj * 16, D, wmma::mem_row_major);
      wmma::fill_fragment(ws, 0.0f);
      mma_k<FragA, FragB>(ws, D, W + ti * 16 * D, D, sh + tj * 16, LH);
#pragma unroll
      for (int e = 0; e < u.num_elements; ++e) u.x[e] -= ws.x[e];
      wmma::store_matrix_sync(vf + ti * 16 * LF + tj * 16, u, LF, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * BV; e += kThreads) vh[(e / BV) * LH + e % BV] = __float2half(vf[(e / BV) * LF + e % BV]);
    __syncthreads();
    // o = Qg S + P v' into vf (v' lives on in vh)
    for (int tile = warp; tile < 16; tile += kWarps) {
      const int ti = tile / 4, tj = tile % 4;
      Acc o;
      wmma::fill_fragment(o, 0.0f);
      mma_k<FragA, FragB>(o, D, Qg + ti * 16 * D, D, sh + tj * 16, LH);
      mma_k<FragA, FragB>(o, C, P + ti * 16 * C, C, vh + tj * 16, LH);
      wmma::store_matrix_sync(vf + ti * 16 * LF + tj * 16, o, LF, wmma::mem_row_major);
    }
    __syncthreads();  // sh is read no more this chunk
    for (int e = threadIdx.x; e < n * BV; e += kThreads)
      out[(size_t(T0 + c * C + e / BV) * Hv + h) * D + col0 + e % BV] = vf[(e / BV) * LF + e % BV];
    // S = e^gamma_last S + Kd^T v': 32 tiles of [D x BV]
    const float decay = in.last[base];
    for (int tile = warp; tile < (D / 16) * 4; tile += kWarps) {
      const int ti = tile / 4, tj = tile % 4;
      Acc acc;
      wmma::load_matrix_sync(acc, sf + ti * 16 * LF + tj * 16, LF, wmma::mem_row_major);
#pragma unroll
      for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= decay;
      mma_k<FragAT, FragB>(acc, C, Kd + ti * 16, D, vh + tj * 16, LH);
      wmma::store_matrix_sync(sf + ti * 16 * LF + tj * 16, acc, LF, wmma::mem_row_major);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < D * BV; e += kThreads) sh[(e / BV) * LH + e % BV] = __float2half(sf[(e / BV) * LF + e % BV]);
    __syncthreads();
  }
  for (int e = threadIdx.x; e < D * BV; e += kThreads) st[size_t(e / BV) * D + col0 + e % BV] = sf[(e / BV) * LF + e % BV];
}

template <int D>
void launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& states,
            const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out) {
  const int64_t T = q.size(0), Hk = q.size(1), Hv = v.size(1), S = seq_slots.numel();
  static PerDevice configure;
  configure([] {  // the shared-memory opt-in above 48 KB
    RV_CUDA_CHECK(cudaFuncSetAttribute(prepare_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prepare_smem<D>())));
    RV_CUDA_CHECK(cudaFuncSetAttribute(scan_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(scan_smem<D>())));
  });
  const int64_t chunks = (T + C - 1) / C + S;  // an upper bound on the chunks of S sequences
  const int64_t rows = chunks * Hv * C;
  const Device dev = Device::kCUDA;
  Tensor w = Tensor::uninitialized({rows, D}, DType::kF16, dev), qg = Tensor::uninitialized({rows, D}, DType::kF16, dev);
  Tensor kd = Tensor::uninitialized({rows, D}, DType::kF16, dev), p = Tensor::uninitialized({rows, C}, DType::kF16, dev);
  Tensor u = Tensor::uninitialized({rows, D}, DType::kF32, dev), last = Tensor::uninitialized({chunks * Hv}, DType::kF32, dev);
  const Scratch sc{w.ptr<__half>(), qg.ptr<__half>(), kd.ptr<__half>(), p.ptr<__half>(), u.ptr<float>(), last.ptr<float>()};
  prepare_kernel<D><<<dim3{unsigned(chunks), unsigned(Hv)}, kThreads, prepare_smem<D>(), stream()>>>(
      q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(), beta.ptr<float>(), seq_starts.ptr<int32_t>(),
      seq_slots.ptr<int32_t>(), int(S), int(Hk), int(Hv), 1.0f / sqrtf(float(D)), sc);
  RV_CUDA_CHECK(cudaGetLastError());
  scan_kernel<D><<<dim3{unsigned(Hv), unsigned(D / BV), unsigned(S)}, kThreads, scan_smem<D>(), stream()>>>(
      seq_starts.ptr<int32_t>(), seq_slots.ptr<int32_t>(), int(S), int(Hv), sc, states.ptr<float>(), out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

// Runs the chunked form when it applies (Dk == Dv == 64 or 128); returns false otherwise.
inline bool run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out) {
  const int64_t Dk = q.size(2), Dv = v.size(2);
  if (Dk != Dv || (Dk != 64 && Dk != 128)) return false;
  if (Dk == 64) launch<64>(q, k, v, g, beta, states, seq_starts, seq_slots, out);
  else launch<128>(q, k, v, g, beta, states, seq_starts, seq_slots, out);
  return true;
}

}  // namespace revolta::cuda::gdn_chunked
