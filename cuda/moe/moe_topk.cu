// MoE routing on the device: one warp per token; softmax statistics over the experts, then the K
// largest (ties to the lower expert id, as on the CPU). Up to 512 experts (Qwen3-Next) the logits
// stay in registers and a threshold picks the few candidates to rank (topk_row.cuh); more experts
// take K rounds of a warp arg-max, each excluding what earlier rounds took and reading the logits
// again. Decode routing (moe_route) is one launch, which may also add the block's output to the
// residual stream and normalise it first (H200, Qwen3-Next shape, 32 layers, concurrency 1, same
// run: 463.2 / 457.2 / 457.6 tok/s against 447.3 / 449.7 / 450.7 with the norm as a kernel of its
// own and the router rows loaded after the wait; 469.8 / 466.4 / 468.9 against 462.0 / 461.3 /
// 456.9 once spare warps of the last block write the rows while one picks the experts).
#include <type_traits>

#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "cuda_ops.h"
#include "core/arrival.cuh"
#include "core/block_sum.cuh"
#include "core/warp_reduce.cuh"
#include "moe/topk_row.cuh"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void moe_topk_kernel(const float* __restrict__ logits, int64_t T, int E, int K, int S, bool renorm,
                                int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;
  const float* l = logits + t * (E + S);
  const int KS = K + S;  // ids / weights row: K routed slots, then the shared expert
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += __expf(l[e] - mx);
  sum = warp_sum(sum);
  // Rank by logit (the softmax is monotonic); (value desc, id asc), below the previous pick.
  float pv = INFINITY;
  int pi = -1;
  float top = 0.0f;
  for (int k = 0; k < K; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = l[e];
      const bool below = v < pv || (v == pv && e > pi);
      if (below && (v > bv || (v == bv && e < bi))) bv = v, bi = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    const float p = __expf(bv - mx) / sum;
    if (lane == 0) ids[t * KS + k] = bi, weights[t * KS + k] = p;
    top += p;
    pv = bv, pi = bi;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[t * KS + k] /= top;
  if (S && lane == 0) ids[t * KS + K] = E, weights[t * KS + K] = sigmoid(l[E]);
}

template <int N>
__global__ void moe_topk_registers_kernel(const float* __restrict__ logits, int64_t T, int E, int K, int S,
                                          bool renorm, int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (t < T) topk_registers_row<N>(logits + t * (E + S), E, K, S, renorm, ids + t * (K + S), weights + t * (K + S));
}

// ops::moe_route's `first` (a block's output added to the residual stream and normalised before
// the routing reads it).
struct PreNorm {
  float* residual;
  const float* weight;
  float eps;
  float* normed;
};

// The first kHeld float4s of a row per thread of a 128-thread block (rows of up to 2048 floats):
// what a block loads of the norm weight before its predecessor has finished.
constexpr int kHeld = 4;

// This block's copy of the M normalised rows, into xs ([M][H / 4] in shared memory): residual + y
// and its RMSNorm, computed alike by every block instead of by a norm kernel of its own (a launch
// and its round trips for 16 KB of data). nw: the norm weight's first float4s, loaded already.
template <int M>
__device__ __forceinline__ void add_norm_rows(const float* y, const PreNorm& pre, int H, const float4 (&nw)[kHeld],
                                              float4* xs) {
  constexpr int kBatch = M == 1 ? 4 : M == 2 ? 2 : 1;  // float4s per row in flight per thread (registers)
  __shared__ float sums[32];
  __shared__ float total;
  const int n4 = H / 4, step = int(blockDim.x);
  float ss[M] = {};
  for (int base = 0; base < n4; base += kBatch * step) {
    float4 a[M][kBatch], b[M][kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = min(base + u * step + int(threadIdx.x), n4 - 1);
#pragma unroll
      for (int m = 0; m < M; ++m)
        a[m][u] = reinterpret_cast<const float4*>(y + size_t(m) * H)[i],
        b[m][u] = reinterpret_cast<const float4*>(pre.residual + size_t(m) * H)[i];
    }
    // Every value takes part in the sums (those past the row times 0), so that no load waits
    // inside a branch: the compiler would otherwise issue each one only where it is used.
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step + int(threadIdx.x);
      const float in_row = i < n4 ? 1.0f : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float4 v = {a[m][u].x + b[m][u].x, a[m][u].y + b[m][u].y, a[m][u].z + b[m][u].z, a[m][u].w + b[m][u].w};
        if (i < n4) xs[m * n4 + i] = v;
        ss[m] += in_row * (v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w);
      }
    }
  }
  float inv[M];
#pragma unroll
  for (int m = 0; m < M; ++m) inv[m] = rsqrtf(block_sum(ss[m], sums, total) / float(H) + pre.eps);
  auto scale = [&](int i, const float4& w) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 v = xs[m * n4 + i];
      xs[m * n4 + i] = {w.x * (v.x * inv[m]), w.y * (v.y * inv[m]), w.z * (v.z * inv[m]), w.w * (v.w * inv[m])};
    }
  };
#pragma unroll
  for (int u = 0; u < kHeld; ++u)
    if (u * step + int(threadIdx.x) < n4) scale(u * step + threadIdx.x, nw[u]);
  for (int i = kHeld * step + threadIdx.x; i < n4; i += step) scale(i, reinterpret_cast<const float4*>(pre.weight)[i]);
  __syncthreads();
}

// Decode routing in one launch: a warp per router row computes the logits of the M tokens (f32
// router), then the last block to finish runs the top-k, a warp per token. The row's first
// kRowSteps x 256 floats are loaded into registers before the predecessor has finished (they do
// not depend on it), so what is left after the wait is x's round trip.
// With kNorm, x is a block's output: every block normalises residual + x itself first
// (add_norm_rows), and the last block also writes the new residual and the normalised rows, which
// nobody reads before this kernel has completed (each block has read the old residual before it
// arrives).
constexpr int kRowSteps = 8;

template <int M, bool kNorm>
__global__ void __launch_bounds__(kWarps * 32)
    route_kernel(const float* __restrict__ x, const float* __restrict__ router, float* logits, int E, int S, int H,
                 int K, bool renorm, int32_t* __restrict__ ids, float* __restrict__ weights, int* counter, PreNorm pre) {
  extern __shared__ float4 xs[];  // kNorm: [M][H / 4]
  const int lane = threadIdx.x % 32, r = blockIdx.x * kWarps + threadIdx.x / 32, R = E + S;
  const float* w = router + size_t(min(r, R - 1)) * H;  // (warps past the last row load it again, unused)
  float wv[kRowSteps][8];
#pragma unroll
  for (int j = 0; j < kRowSteps; ++j) {
    const int k = lane * 8 + j * 256;
    if (k < H) load_weight8(w + k, wv[j]);
    else
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[j][i] = 0.0f;
  }
  float4 nw[kHeld];
  if (kNorm)
#pragma unroll
    for (int u = 0; u < kHeld; ++u)
      nw[u] = reinterpret_cast<const float4*>(pre.weight)[min(u * int(blockDim.x) + int(threadIdx.x), H / 4 - 1)];
  wait_for_predecessor();
  if (kNorm) add_norm_rows<M>(x, pre, H, nw, xs);
  auto x8 = [&](int m, int k, float (&xv)[8]) {
    if (kNorm) {
      split8(xs[(size_t(m) * H + k) / 4], xs[(size_t(m) * H + k) / 4 + 1], xv);
    } else {
      load8_input(x + size_t(m) * H + k, xv);
    }
  };
  if (r < R) {  // no early return: every thread reaches the arrival count
    float acc[M] = {};
#pragma unroll
    for (int j = 0; j < kRowSteps; ++j) {
      const int k = lane * 8 + j * 256;
      if (k >= H) break;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[8];
        x8(m, k, xv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wv[j][i] * xv[i];
      }
    }
    for (int k = lane * 8 + kRowSteps * 256; k < H; k += 256) {  // rows past 2048 (H % 8 == 0, checked by the caller)
      float wk[8];
      load_weight8(w + k, wk);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[8];
        x8(m, k, xv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wk[i] * xv[i];
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[m];
      v = warp_sum(v);
      if (lane == 0) logits[size_t(m) * R + r] = v;
    }
  }
  let_successor_launch();
  if (!last_to_arrive(counter, int(gridDim.x))) return;
  for (int t = threadIdx.x / 32; t < M; t += kWarps) topk_registers_row<16, true>(logits + size_t(t) * R, E, K, S, renorm, ids + t * (K + S), weights + t * (K + S));
  // The warps past the M that pick the experts write the residual and normed rows meanwhile (with
  // no warp to spare, the pickers write them afterwards).
  const int writers_from = M < kWarps ? 32 * M : 0;
  if (kNorm && int(threadIdx.x) >= writers_from) {
    const int n4 = H / 4;
    for (int j = threadIdx.x - writers_from; j < M * n4; j += blockDim.x - writers_from) {
      const float4 a = reinterpret_cast<const float4*>(x)[j];
      float4& res = reinterpret_cast<float4*>(pre.residual)[j];
      const float4 b = res;
      res = {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w};
      reinterpret_cast<float4*>(pre.normed)[j] = xs[j];
    }
  }
}

// The routing after the add + norm for one token with rows of up to 2048 columns, split by
// columns instead of by rows: warp w of a block holds, for each of the block's kWarps router rows,
// the columns {p * 1024 + w * 256 + lane * 8 + [0, 8)} (loaded with the norm weight before the
// wait, times the norm weight), so after the wait a lane loads only its 16 columns of y and the
// residual (one round trip)
// and the block needs one barrier to combine the warps' partial dots and sums of squares; no copy
// of the row goes through shared memory. logit = inv * sum((w * nw) * h) (the scale after the
// dot, not before it as on the CPU: equal up to rounding). The last block writes the residual and the
// normed row from the warps' registers while warp 0 picks the experts.
constexpr int kNorm1Passes = 2, kNorm1Columns = kNorm1Passes * kWarps * 256;

__global__ void __launch_bounds__(kWarps * 32, 1)
    route_norm1_kernel(const float* __restrict__ x, const float* __restrict__ router, float* logits, int E, int S, int H,
                       int K, bool renorm, int32_t* __restrict__ ids, float* __restrict__ weights, int* counter,
                       PreNorm pre) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, R = E + S, r0 = blockIdx.x * kWarps;
  auto column = [&](int p) { return p * (kWarps * 256) + warp * 256 + lane * 8; };
  // The router columns times the norm weight's, before the wait: after it the lane holds only
  // these and its 16 columns of y and the residual, all loaded at once.
  float wv[kWarps][kNorm1Passes][8];
#pragma unroll
  for (int p = 0; p < kNorm1Passes; ++p) {
    const int c = column(p);
    float nw[8];
    if (c < H) load8(pre.weight + c, nw);
#pragma unroll
    for (int r = 0; r < kWarps; ++r) {
      if (c < H) load_weight8(router + size_t(min(r0 + r, R - 1)) * H + c, wv[r][p]);
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[r][p][i] = c < H ? wv[r][p][i] * nw[i] : 0.0f;
    }
  }
  wait_for_predecessor();
  // Both passes' loads in one asm statement, so that one round trip covers them (separate loads,
  // even volatile ones, were compiled pass by pass: the second pass issued after the first was used).
  static_assert(kNorm1Passes == 2, "the load statement below covers two passes");
  float4 a[kNorm1Passes][2], b[kNorm1Passes][2];
  {
    const float* x0 = x + min(column(0), H - 8);  // past H: a valid address, weights 0
    const float* x1 = x + min(column(1), H - 8);
    const float* r0p = pre.residual + min(column(0), H - 8);
    const float* r1p = pre.residual + min(column(1), H - 8);
    asm volatile(
        "ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%32];\n\t"
        "ld.global.cg.v4.f32 {%4, %5, %6, %7}, [%32+16];\n\t"
        "ld.global.cg.v4.f32 {%8, %9, %10, %11}, [%33];\n\t"
        "ld.global.cg.v4.f32 {%12, %13, %14, %15}, [%33+16];\n\t"
        "ld.global.cg.v4.f32 {%16, %17, %18, %19}, [%34];\n\t"
        "ld.global.cg.v4.f32 {%20, %21, %22, %23}, [%34+16];\n\t"
        "ld.global.cg.v4.f32 {%24, %25, %26, %27}, [%35];\n\t"
        "ld.global.cg.v4.f32 {%28, %29, %30, %31}, [%35+16];"
        : "=f"(a[0][0].x), "=f"(a[0][0].y), "=f"(a[0][0].z), "=f"(a[0][0].w), "=f"(a[0][1].x), "=f"(a[0][1].y),
          "=f"(a[0][1].z), "=f"(a[0][1].w), "=f"(a[1][0].x), "=f"(a[1][0].y), "=f"(a[1][0].z), "=f"(a[1][0].w),
          "=f"(a[1][1].x), "=f"(a[1][1].y), "=f"(a[1][1].z), "=f"(a[1][1].w), "=f"(b[0][0].x), "=f"(b[0][0].y),
          "=f"(b[0][0].z), "=f"(b[0][0].w), "=f"(b[0][1].x), "=f"(b[0][1].y), "=f"(b[0][1].z), "=f"(b[0][1].w),
          "=f"(b[1][0].x), "=f"(b[1][0].y), "=f"(b[1][0].z), "=f"(b[1][0].w), "=f"(b[1][1].x), "=f"(b[1][1].y),
          "=f"(b[1][1].z), "=f"(b[1][1].w)
        : "l"(x0), "l"(x1), "l"(r0p), "l"(r1p)
        : "memory");
  }
  float h[kNorm1Passes][8];
#pragma unroll
  for (int p = 0; p < kNorm1Passes; ++p) {
    const float keep = column(p) < H ? 1.0f : 0.0f;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      h[p][4 * q] = keep * (a[p][q].x + b[p][q].x), h[p][4 * q + 1] = keep * (a[p][q].y + b[p][q].y);
      h[p][4 * q + 2] = keep * (a[p][q].z + b[p][q].z), h[p][4 * q + 3] = keep * (a[p][q].w + b[p][q].w);
    }
  }
  float ss = 0.0f, dot[kWarps] = {};
#pragma unroll
  for (int p = 0; p < kNorm1Passes; ++p)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      ss += h[p][i] * h[p][i];
#pragma unroll
      for (int r = 0; r < kWarps; ++r) dot[r] += wv[r][p][i] * h[p][i];
    }
  __shared__ float part[kWarps][kWarps + 1];  // [warp][row], then the warp's sum of squares
  warp_dots_and_squares(dot, ss, part[warp]);
  __syncthreads();
  float total = 0.0f, d = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += part[w][kWarps], d += part[w][warp];
  const float inv = rsqrtf(total / float(H) + pre.eps);
  if (lane == 0 && r0 + warp < R) logits[r0 + warp] = d * inv;
  let_successor_launch();
  if (!last_to_arrive(counter, int(gridDim.x))) return;
  // Every block has read the old residual before it arrived: the last one writes the new rows.
#pragma unroll
  for (int p = 0; p < kNorm1Passes; ++p) {
    const int c = column(p);
    if (c >= H) continue;
    float4* res = reinterpret_cast<float4*>(pre.residual + c);
    float4* nrm = reinterpret_cast<float4*>(pre.normed + c);
    float nw[8];
    load8(pre.weight + c, nw);
    res[0] = {h[p][0], h[p][1], h[p][2], h[p][3]}, res[1] = {h[p][4], h[p][5], h[p][6], h[p][7]};
    nrm[0] = {nw[0] * (h[p][0] * inv), nw[1] * (h[p][1] * inv), nw[2] * (h[p][2] * inv), nw[3] * (h[p][3] * inv)};
    nrm[1] = {nw[4] * (h[p][4] * inv), nw[5] * (h[p][5] * inv), nw[6] * (h[p][6] * inv), nw[7] * (h[p][7] * inv)};
  }
  if (warp == 0) topk_registers_row<16, true>(logits, E, K, S, renorm, ids, weights);
}

}  // namespace

void moe_route(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, Tensor& ids, Tensor& weights,
               const ops::ResidualNorm* first) {
  const int64_t T = x.size(0), H = x.size(1), R = router.size(0), S = R - E, K = ids.size(1) - S;
  RV_CHECK(router.size(1) == H && (S == 0 || S == 1) && K >= 1 && K <= E, "CUDA moe_route: x ", x.shape_str(),
           " router ", router.shape_str(), " for ", E, " experts, ids ", ids.shape_str());
  if (T == 0) return;
  Tensor logits = Tensor::uninitialized({T, R}, DType::kF32, Device::kCUDA);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool fused = T <= 4 && E <= 32 * 16 && H % 8 == 0 && router.dtype() == DType::kF32 && aligned(x.data()) &&
                     aligned(router.data()) &&
                     (!first || (first->weight->dtype() == DType::kF32 && T * H * 4 <= 48 * 1024 &&
                                 aligned(first->residual->data()) && aligned(first->normed->data()) &&
                                 aligned(first->weight->data())));
  if (!fused) {
    if (first) add_rms_norm(*first->residual, x, *first->weight, first->eps, *first->normed);
    linear(first ? *first->normed : x, router, nullptr, logits);
    moe_topk(logits, E, renormalize, ids, weights);
    return;
  }
  const PreNorm pre = first ? PreNorm{first->residual->ptr<float>(), first->weight->ptr<float>(), first->eps,
                                      first->normed->ptr<float>()}
                            : PreNorm{};
  const unsigned blocks = unsigned((R + kWarps - 1) / kWarps);
  auto go = [&](auto kernel, size_t smem) {
    launch_dependent(kernel, dim3(blocks), dim3(kWarps * 32), smem, x.ptr<float>(), router.ptr<float>(),
                     logits.ptr<float>(), int(E), int(S), int(H), int(K), renormalize, ids.ptr<int32_t>(),
                     weights.ptr<float>(), arrival_counters(), pre);
    RV_CUDA_CHECK(cudaGetLastError());
  };
  if (first && T == 1 && H <= kNorm1Columns) return go(route_norm1_kernel, 0);  // one token, rows of <= 2048 columns
  const size_t rows_smem = first ? size_t(T * H * 4) : 0;  // route_kernel's copies of the normed rows
  auto go_m = [&](auto m) {
    constexpr int M = decltype(m)::value;
    if (first) go(route_kernel<M, true>, rows_smem);
    else go(route_kernel<M, false>, rows_smem);
  };
  switch (T) {
    case 1: go_m(std::integral_constant<int, 1>{}); break;
    case 2: go_m(std::integral_constant<int, 2>{}); break;
    case 3: go_m(std::integral_constant<int, 3>{}); break;
    default: go_m(std::integral_constant<int, 4>{}); break;
  }
}

void moe_topk(const Tensor& logits, int64_t E, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), S = logits.size(1) - E, K = ids.size(1) - S;
  RV_CHECK((S == 0 || S == 1) && K >= 1 && K <= E, "CUDA moe_topk: logits ", logits.shape_str(), " for ", E,
           " experts, ids ", ids.shape_str());
  if (T == 0) return;
  const unsigned blocks = unsigned((T + kWarps - 1) / kWarps);
  auto go = [&](auto kernel) {
    kernel<<<blocks, 32 * kWarps, 0, stream()>>>(logits.ptr<float>(), T, int(E), int(K), int(S), renormalize,
                                                 ids.ptr<int32_t>(), weights.ptr<float>());
  };
  if (E <= 32 * 4) go(moe_topk_registers_kernel<4>);
  else if (E <= 32 * 16) go(moe_topk_registers_kernel<16>);
  else go(moe_topk_kernel);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
