// A decode batch's MoE block in one persistent kernel (ops::moe_decode). Separate route, gate/up
// and down kernels each paid a few microseconds of ramp and drain around their bytes, which at a
// token or two is as long as the bytes themselves. Here the grid is sized to be resident at once
// (a block per multiprocessor) and moves through the phases on grid barriers (core/arrival.cuh):
//  1. the router rows (f32) and, since it needs no routing, the shared expert's gate/up rows;
//  2. every block routes the tokens itself from the logits (a warp per token, topk_row.cuh), so no
//     second barrier hands the ids around;
//  3. the routed experts' gate/up rows, a warp per two (token, slot, intermediate row) items;
//  4. a warp per output row h of token t loads row h of each slot's down matrix (for its first two
//     rows) *before* waiting for the activations, so those bytes stream while the last gate/up rows
//     finish; then the block stages the activations in shared memory and sums
//     sum_k w_k (down_k[h] . act_k) in registers;
//  5. the last block to arrive adds the token's row to the residual stream and normalises it.
// Weights stream with 16-byte loads, every load of a row issued before any is used.
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/element.cuh"
#include "cuda_ops.h"
#include "moe/topk_row.cuh"
#include "norms/residual_norm_tail.cuh"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxTokens = 2;     // decode batches this kernel takes (more: the three-kernel path)
constexpr int kMaxSlots = 12;     // routed + shared slots per token whose down rows are prefetched
constexpr int kMaxInter = 512;    // intermediate columns a lane holds as two 8-element chunks
constexpr int kMaxExperts = 512;  // topk_registers_row<16>
constexpr int kStep = 32 * 8;     // elements a warp covers per 16-byte load of each lane

struct Args {
  const float* x;       // [M, H]
  const float* router;  // f32 [R, H], R = E + S
  float* logits;        // [M, R] scratch
  int E, S, K, H, I;    // K slots per token (routed + shared)
  bool renorm;
  int32_t* ids;         // [M, K]
  float* weights;       // [M, K]
  const int64_t* gu_at;
  const int64_t* down_at;
  float* act;           // [M, K, I] scratch
  float* out;           // [M, H]
  float* residual;
  const float* norm_weight;
  float eps;
  float* normed;
  int* counter;
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void dot8(const uint4& raw, const float* x, float& acc) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    acc += f.x * x[2 * i] + f.y * x[2 * i + 1];
  }
}

// One router row for the N tokens: logits[n * R + r] = x_n . router[r].
template <int N>
__device__ void router_row(const Args& a, int r) {
  const int lane = threadIdx.x % 32, R = a.E + a.S;
  const float* w = a.router + size_t(r) * a.H;
  float acc[N] = {};
  for (int k0 = lane * 8; k0 < a.H; k0 += 8 * kStep) {  // eight steps of 8 floats in flight
    float wv[8][8];
#pragma unroll
    for (int s = 0; s < 8; ++s)
      if (k0 + s * kStep < a.H) load8(w + k0 + s * kStep, wv[s]);
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      if (k0 + s * kStep >= a.H) break;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        float xv[8];
        load8(a.x + size_t(n) * a.H + k0 + s * kStep, xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[n] += wv[s][e] * xv[e];
      }
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const float v = warp_sum(acc[n]);
    if (lane == 0) a.logits[size_t(n) * R + r] = v;
  }
}

// One intermediate row of one (token, slot): act[(m * K + slot) * I + i] = silu(gate_i . x_m) * (up_i . x_m)
// with w the expert's [gate; up] matrix ([2I, H]); w null: nothing to do.
struct GateUpItem {
  const __half* w;
  int i, m, slot;
};

// P items at once, every weight load of all of them issued before any is used.
template <int P>
__device__ void gate_up_rows(const Args& a, const GateUpItem (&it)[P]) {
  const int lane = threadIdx.x % 32;
  float g[P] = {}, u[P] = {};
  for (int k0 = lane * 8; k0 < a.H; k0 += 8 * kStep) {
    uint4 rg[P][8], ru[P][8];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int s = 0; s < 8; ++s)
        if (it[p].w && k0 + s * kStep < a.H) {
          rg[p][s] = __ldg(reinterpret_cast<const uint4*>(it[p].w + size_t(it[p].i) * a.H + k0 + s * kStep));
          ru[p][s] = __ldg(reinterpret_cast<const uint4*>(it[p].w + size_t(a.I + it[p].i) * a.H + k0 + s * kStep));
        }
#pragma unroll
    for (int s = 0; s < 8; ++s) {
      if (k0 + s * kStep >= a.H) break;
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (it[p].w) {
          float xv[8];
          load8(a.x + size_t(it[p].m) * a.H + k0 + s * kStep, xv);
          dot8(rg[p][s], xv, g[p]);
          dot8(ru[p][s], xv, u[p]);
        }
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float gv = warp_sum(g[p]), uv = warp_sum(u[p]);
    if (lane == 0 && it[p].w) a.act[(size_t(it[p].m) * a.K + it[p].slot) * a.I + it[p].i] = gv / (1.0f + __expf(-gv)) * uv;
  }
}

// A 16-byte weight load the compiler keeps where it is written: the down rows are loaded before
// the grid barrier on purpose, and an ordinary read-only load may be sunk past it to its use.
__device__ __forceinline__ uint4 load_pinned(const __half* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Row h of every slot's down matrix for token m: two 8-element chunks per lane (I <= 512).
__device__ __forceinline__ void load_down_row(const Args& a, const int32_t (*ids)[kMaxSlots], int m, int h,
                                              uint4 (&w)[kMaxSlots][2]) {
  const int lane = threadIdx.x % 32;
  const __half* rows[kMaxSlots];
#pragma unroll
  for (int k = 0; k < kMaxSlots; ++k)
    rows[k] = reinterpret_cast<const __half*>(a.down_at[ids[m][min(k, a.K - 1)]]) + size_t(h) * a.I;
#pragma unroll
  for (int k = 0; k < kMaxSlots; ++k)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      if (k < a.K && lane * 8 + c * kStep < a.I) w[k][c] = load_pinned(rows[k] + lane * 8 + c * kStep);
}

// Output row j (token j / H, row j % H) from the slots' down rows wr and the staged activations.
__device__ __forceinline__ void down_row(const Args& a, const float* act_s, const float (*wts)[kMaxSlots],
                                         const uint4 (&wr)[kMaxSlots][2], int j) {
  const int lane = threadIdx.x % 32, m = j / a.H, h = j % a.H;
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxSlots; ++k)
    if (k < a.K) {
      const float* act = act_s + (m * a.K + k) * a.I;
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (lane * 8 + c * kStep < a.I) dot8(wr[k][c], act + lane * 8 + c * kStep, s);
      acc += wts[m][k] * s;
    }
  acc = warp_sum(acc);
  if (lane == 0) a.out[size_t(m) * a.H + h] = acc;
}

// One block per multiprocessor with up to 255 registers a thread: a warp holds two gate/up items
// (16 KB) or two down rows of every slot (22 KB at Qwen3-Next's shape) in flight.
template <int M>
__global__ void __launch_bounds__(kThreads, 1) moe_decode_kernel(Args a) {
  extern __shared__ __align__(16) float act_s[];  // [M, K, I], staged once every gate/up row is in
  __shared__ int32_t ids[M][kMaxSlots];
  __shared__ float wts[M][kMaxSlots];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int gw = blockIdx.x * kWarps + warp, NW = gridDim.x * kWarps, G = gridDim.x;
  const int R = a.E + a.S, Kr = a.K - a.S;

  // 1. Router rows, then the shared expert's gate/up rows (slot Kr, every token at once).
  for (int j = gw; j < R + a.S * a.I; j += NW) {
    if (j < R) {
      router_row<M>(a, j);
      continue;
    }
    GateUpItem it[M];
#pragma unroll
    for (int m = 0; m < M; ++m) it[m] = {reinterpret_cast<const __half*>(a.gu_at[a.E]), j - R, m, Kr};
    gate_up_rows<M>(a, it);
  }
  grid_barrier(a.counter, G);

  // 2. Every block routes the tokens for itself.
  if (warp < M) topk_registers_row<16, true>(a.logits + size_t(warp) * R, a.E, Kr, a.S, a.renorm, ids[warp], wts[warp]);
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x < M * a.K) {
    const int m = threadIdx.x / a.K, k = threadIdx.x % a.K;
    a.ids[threadIdx.x] = ids[m][k], a.weights[threadIdx.x] = wts[m][k];
  }

  // 3. The routed experts' gate/up rows, two items per warp at a time.
  const int items = M * Kr * a.I;
  for (int j = gw; j < items; j += 2 * NW) {
    GateUpItem it[2];
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const int jj = j + p * NW, pair = jj / a.I, m = pair / Kr, k = pair % Kr;
      it[p] = jj < items ? GateUpItem{reinterpret_cast<const __half*>(a.gu_at[ids[m][k]]), jj % a.I, m, k}
                         : GateUpItem{nullptr, 0, 0, 0};
    }
    gate_up_rows<2>(a, it);
  }

  // 4. Down rows: this warp's first two rows are loaded before the barrier.
  const int rows = M * a.H;
  uint4 w[2][kMaxSlots][2];
  if (gw < rows) load_down_row(a, ids, gw / a.H, gw % a.H, w[0]);
  if (gw + NW < rows) load_down_row(a, ids, (gw + NW) / a.H, (gw + NW) % a.H, w[1]);
  grid_barrier(a.counter, 2 * G);
  const int n = M * a.K * a.I;  // a multiple of 8
  for (int base = threadIdx.x * 4; base < n; base += 4 * kThreads * 4) {  // four L2 loads in flight
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = load_l2(reinterpret_cast<const float4*>(a.act + min(base + u * kThreads * 4, n - 4)));
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (base + u * kThreads * 4 < n) *reinterpret_cast<float4*>(act_s + base + u * kThreads * 4) = v[u];
  }
  __syncthreads();
  if (gw < rows) down_row(a, act_s, wts, w[0], gw);
  if (gw + NW < rows) down_row(a, act_s, wts, w[1], gw + NW);
  for (int j = gw + 2 * NW; j < rows; j += NW) {
    load_down_row(a, ids, j / a.H, j % a.H, w[0]);
    down_row(a, act_s, wts, w[0], j);
  }

  // 5. The residual add + norm of every token, by the last block to finish.
  if (!last_to_arrive(a.counter, 3 * G)) return;
  for (int m = 0; m < M; ++m)
    residual_norm_row(a.residual + size_t(m) * a.H, a.out + size_t(m) * a.H, a.norm_weight, a.eps,
                      a.normed + size_t(m) * a.H, a.H);
}

// Blocks of the kernel that are resident at once on this device (the grid barriers need all).
template <int M>
int resident_blocks(size_t smem) {
  int per_sm = 0;
  RV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_decode_kernel<M>, kThreads, smem));
  RV_CHECK(per_sm > 0, "CUDA moe_decode: the kernel does not fit a multiprocessor");
  return per_sm * sm_count();
}

}  // namespace

void moe_decode(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, const ops::ExpertTable& ex,
                Tensor& ids, Tensor& weights, Tensor& out, const ops::ResidualNorm& then) {
  const int64_t T = x.size(0), H = ex.hidden, I = ex.inter, R = router.size(0), S = R - E, K = ids.size(1);
  const size_t smem = size_t(T * K * I) * sizeof(float);
  const bool fused = T >= 1 && T <= kMaxTokens && E <= kMaxExperts && K <= kMaxSlots && I <= kMaxInter &&
                     ex.dtype == DType::kF16 && router.dtype() == DType::kF32 && H % 8 == 0 && I % 8 == 0 &&
                     (S == 0 || S == 1) && smem <= 48 * 1024 && then.weight->dtype() == DType::kF32 &&
                     reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && reinterpret_cast<uintptr_t>(router.data()) % 16 == 0;
  if (!fused) {
    cuda::moe_route(x, router, E, renormalize, ids, weights);
    cuda::moe_experts(x, ids, weights, ex, out, &then);
    return;
  }
  RV_CHECK(router.size(1) == H && x.size(1) == H && K - S >= 1 && K - S <= E, "CUDA moe_decode: x ", x.shape_str(),
           " router ", router.shape_str(), " for ", E, " experts, ids ", ids.shape_str());
  Tensor logits = Tensor::uninitialized({T, R}, DType::kF32, Device::kCUDA);
  Tensor act = Tensor::uninitialized({T, K, I}, DType::kF32, Device::kCUDA);
  const Args a{x.ptr<float>(), router.ptr<float>(), logits.ptr<float>(), int(E), int(S), int(K), int(H), int(I),
               renormalize, ids.ptr<int32_t>(), weights.ptr<float>(), ex.gate_up.ptr<int64_t>(),
               ex.down.ptr<int64_t>(), act.ptr<float>(), out.ptr<float>(), then.residual->ptr<float>(),
               then.weight->ptr<float>(), then.eps, then.normed->ptr<float>(), arrival_counters()};
  auto go = [&](auto kernel, int blocks) {
    kernel<<<unsigned(blocks), kThreads, smem, stream()>>>(a);
  };
  if (T == 1) go(moe_decode_kernel<1>, resident_blocks<1>(smem));
  else go(moe_decode_kernel<2>, resident_blocks<2>(smem));
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda

