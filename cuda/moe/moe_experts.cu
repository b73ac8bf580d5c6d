// Decode-sized mixture of experts (ops::moe_experts): the routed ids stay on the device and each
// (token, slot) pair finds its expert's matrices through the layer's address table, so a decode
// step needs no copy to the host and can be captured in a graph.
//  1. gate_up: a warp per two intermediate rows i of pair (t, k) writes silu(gate_i . x_t) * (up_i . x_t);
//  2. down: a block per 8 hidden rows of token t sums weights[t, k] * (down_h . act[t, k]) over the
//     token's K slots (a warp per slot), so the combine needs no atomics and out is written once.
// Weight rows stream with 16-byte loads; a pair reads its expert once, which is what a decode step
// of a few tokens costs anyway.
//
// Past kFusedTokens tokens (prefill) the pairs are grouped by expert on the device (a count, a
// scan, a scatter) and each expert's rows go through tensor-core tiles in one grouped GEMM per
// matrix (gemm_tensor_core.cuh); a last pass sums each token's slots in slot order, so the result
// does not depend on the order the scatter's atomics gave the rows.
#include <cuda_fp16.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "cuda_ops.h"
#include "gemm/gemm_tensor_core.cuh"
#include "norms/residual_norm_tail.cuh"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A warp computes P intermediate rows of one (token, slot) pair; U steps of 8 elements per lane
// are loaded before any is used, so 2 x P x U 16-byte weight loads are in flight per lane (a decode
// step has few warps per expert, and latency would bound it) and the grid fits one wave.
template <int P, int U>
__global__ void __launch_bounds__(kWarps * 32)
    moe_gate_up_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids, const int64_t* __restrict__ gu_at,
                       float* __restrict__ act, int K, int H, int I) {
  wait_for_predecessor();
  constexpr int kStep = 32 * 8;
  const int pair = blockIdx.y, t = pair / K, lane = threadIdx.x % 32;
  const int i0 = (blockIdx.x * kWarps + threadIdx.x / 32) * P;
  if (i0 >= I) return;
  const __half* w = reinterpret_cast<const __half*>(gu_at[ids[pair]]);
  const float* xt = x + size_t(t) * H;
  const __half* wg[P];
  const __half* wu[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = min(i0 + p, I - 1);  // a ragged last group recomputes row I - 1; not written
    wg[p] = w + size_t(i) * H, wu[p] = w + size_t(I + i) * H;
  }
  float g[P] = {}, u[P] = {};
  int k = lane * 8;
  for (; k + (U - 1) * kStep < H; k += U * kStep) {  // H % 8 == 0 (checked by the caller)
    float a[P][U][8], b[P][U][8];
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int s = 0; s < U; ++s) load8(wg[p] + k + s * kStep, a[p][s]), load8(wu[p] + k + s * kStep, b[p][s]);
#pragma unroll
    for (int s = 0; s < U; ++s) {
      float xv[8];
      load8(xt + k + s * kStep, xv);
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < 8; ++e) g[p] += a[p][s][e] * xv[e], u[p] += b[p][s][e] * xv[e];
    }
  }
  for (; k < H; k += kStep) {
    float xv[8];
    load8(xt + k, xv);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float a[8], b[8];
      load8(wg[p] + k, a);
      load8(wu[p] + k, b);
#pragma unroll
      for (int e = 0; e < 8; ++e) g[p] += a[e] * xv[e], u[p] += b[e] * xv[e];
    }
  }
  let_successor_launch();  // the weights are read
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const float gv = warp_sum(g[p]), uv = warp_sum(u[p]);
    if (lane == 0 && i0 + p < I) act[size_t(pair) * I + i0 + p] = gv / (1.0f + __expf(-gv)) * uv;
  }
}

// A block computes kDownRows output rows of one token with a warp per slot (blockDim.x / 32 of
// them, up to kMaxDownWarps; more slots are taken in turn), each reading kDownRows rows of its
// expert at once; they meet in shared memory. With a residual norm (kTail), the token's last block
// to finish adds its row to the residual stream and normalises it.
constexpr int kDownRows = 8, kMaxDownWarps = 16;

struct Tail {
  float* residual;
  const float* weight;
  float eps;
  float* normed;
  int* counters;  // one per token
};

template <bool kTail>
__global__ void __launch_bounds__(kMaxDownWarps * 32)
    moe_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                    const int64_t* __restrict__ down_at, float* out, int K, int H, int I, Tail tail) {
  wait_for_predecessor();
  const int t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h0 = blockIdx.x * kDownRows;
  float acc[kDownRows] = {};
  const int warps = blockDim.x / 32;
  for (int k = warp; k < K; k += warps) {
    const int pair = t * K + k;
    const __half* w = reinterpret_cast<const __half*>(down_at[ids[pair]]);
    const float* a = act + size_t(pair) * I;
    float s[kDownRows] = {};
    for (int j = lane * 8; j < I; j += 32 * 8) {  // I % 8 == 0
      float wv[kDownRows][8], av[8];
#pragma unroll
      for (int r = 0; r < kDownRows; ++r) load8(w + size_t(min(h0 + r, H - 1)) * I + j, wv[r]);
      load8(a + j, av);
#pragma unroll
      for (int r = 0; r < kDownRows; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) s[r] += wv[r][e] * av[e];
    }
    const float wk = weights[pair];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) acc[r] += wk * s[r];
  }
  let_successor_launch();
  __shared__ float part[kMaxDownWarps][kDownRows];
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && h0 + int(threadIdx.x) < H) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < warps; ++w) sum += part[w][threadIdx.x];
    out[size_t(t) * H + h0 + threadIdx.x] = sum;
  }
  if (kTail && last_to_arrive(tail.counters + t, int(gridDim.x)))
    residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                      tail.normed + size_t(t) * H, H);
}

constexpr int64_t kFusedTokens = 64, kGroupedSliceTokens = 2048;

__global__ void count_kernel(const int32_t* __restrict__ ids, int P, int32_t* __restrict__ counts) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < P) atomicAdd(counts + ids[p], 1);
}

// Exclusive scans of the rows and of the 64-row tiles per expert (one thread: G is a few hundred).
__global__ void plan_kernel(const int32_t* __restrict__ counts, int G, int32_t* __restrict__ row_first,
                            int32_t* __restrict__ tile_first, int32_t* __restrict__ cursor) {
  if (threadIdx.x != 0) return;
  int rows = 0, tiles = 0;
  for (int g = 0; g < G; ++g) {
    row_first[g] = rows, tile_first[g] = tiles, cursor[g] = 0;
    rows += counts[g];
    tiles += (counts[g] + kGroupedTileRows - 1) / kGroupedTileRows;
  }
  row_first[G] = rows, tile_first[G] = tiles;
}

__global__ void scatter_kernel(const int32_t* __restrict__ ids, int P, int K, const int32_t* __restrict__ row_first,
                               int32_t* __restrict__ cursor, int32_t* __restrict__ rows, int32_t* __restrict__ pos_of) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  const int e = ids[p], pos = row_first[e] + atomicAdd(cursor + e, 1);
  rows[pos] = p / K;
  pos_of[p] = pos;
}

__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ pos_of,
                               const float* __restrict__ weights, int K, int H, float* __restrict__ out) {
  const int t = blockIdx.x;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += weights[t * K + k] * y[size_t(pos_of[t * K + k]) * H + d];
    out[size_t(t) * H + d] = sum;
  }
}

// The tokens of x (a slice of at most kGroupedSliceTokens) grouped by expert on the device.
void grouped_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& out) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter, P = T * K, G = ex.gate_up.numel();
  const Device dev = Device::kCUDA;
  Tensor counts = Tensor::empty({G}, DType::kI32, dev);  // zeroed
  Tensor row_first = Tensor::uninitialized({G + 1}, DType::kI32, dev), tile_first = Tensor::uninitialized({G + 1}, DType::kI32, dev);
  Tensor cursor = Tensor::uninitialized({G}, DType::kI32, dev), rows = Tensor::uninitialized({P}, DType::kI32, dev);
  Tensor pos_of = Tensor::uninitialized({P}, DType::kI32, dev);
  const unsigned blocks = unsigned((P + 255) / 256);
  count_kernel<<<blocks, 256, 0, stream()>>>(ids.ptr<int32_t>(), int(P), counts.ptr<int32_t>());
  plan_kernel<<<1, 32, 0, stream()>>>(counts.ptr<int32_t>(), int(G), row_first.ptr<int32_t>(), tile_first.ptr<int32_t>(),
                                      cursor.ptr<int32_t>());
  scatter_kernel<<<blocks, 256, 0, stream()>>>(ids.ptr<int32_t>(), int(P), int(K), row_first.ptr<int32_t>(),
                                               cursor.ptr<int32_t>(), rows.ptr<int32_t>(), pos_of.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
  const int max_tiles = int((P + kGroupedTileRows - 1) / kGroupedTileRows + G);
  tc::Groups groups{row_first.ptr<int32_t>(), tile_first.ptr<int32_t>(), ex.gate_up.ptr<int64_t>(), rows.ptr<int32_t>(), int(G)};
  Tensor gu = Tensor::uninitialized({P, 2 * I}, DType::kF32, dev), act = Tensor::uninitialized({P, I}, DType::kF32, dev);
  grouped_gemm(x.ptr<float>(), groups, max_tiles, gu.ptr<float>(), int(2 * I), int(H));
  silu_mul(gu, act);
  groups.weights = ex.down.ptr<int64_t>();
  groups.rows = nullptr;  // act is already in grouped order
  Tensor y = Tensor::uninitialized({P, H}, DType::kF32, dev);
  grouped_gemm(act.ptr<float>(), groups, max_tiles, y.ptr<float>(), int(H), int(I));
  combine_kernel<<<unsigned(T), 256, 0, stream()>>>(y.ptr<float>(), pos_of.ptr<int32_t>(), weights.ptr<float>(), int(K),
                                                    int(H), out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& out,
                 const ops::ResidualNorm* then) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter;
  RV_CHECK(ex.dtype == DType::kF16 && H % 8 == 0 && I % 8 == 0 && x.size(1) == H,
           "CUDA moe_experts: float16 experts with hidden and intermediate sizes divisible by 8 (got ",
           dtype_name(ex.dtype), ", ", H, ", ", I, ")");
  if (T == 0) return;
  if (T > kFusedTokens) {
    for (int64_t t0 = 0; t0 < T; t0 += kGroupedSliceTokens) {  // bounds the grouped buffers
      const int64_t t1 = std::min(T, t0 + kGroupedSliceTokens);
      Tensor o = out.slice_rows(t0, t1);
      grouped_experts(x.slice_rows(t0, t1), ids.slice_rows(t0, t1), weights.slice_rows(t0, t1), ex, o);
    }
    if (then) add_rms_norm(*then->residual, out, *then->weight, then->eps, *then->normed);
    return;
  }
  Tensor act = Tensor::uninitialized({T, K, I}, DType::kF32, Device::kCUDA);
  RV_CHECK(!then || (then->weight->dtype() == DType::kF32 && T <= kArrivalCounters),
           "CUDA moe_experts: a float32 norm weight and at most ", kArrivalCounters, " tokens with a residual norm");
  constexpr int P = 2;
  launch_dependent(moe_gate_up_kernel<P, 4>, dim3{unsigned((I + kWarps * P - 1) / (kWarps * P)), unsigned(T * K)},
                   dim3(kWarps * 32), 0, x.ptr<float>(), ids.ptr<int32_t>(), ex.gate_up.ptr<int64_t>(), act.ptr<float>(),
                   int(K), int(H), int(I));
  RV_CUDA_CHECK(cudaGetLastError());
  const unsigned down_warps = unsigned(std::min<int64_t>(K, kMaxDownWarps));
  const dim3 grid{unsigned((H + kDownRows - 1) / kDownRows), unsigned(T)};
  const Tail tail = then ? Tail{then->residual->ptr<float>(), then->weight->ptr<float>(), then->eps,
                                then->normed->ptr<float>(), arrival_counters()}
                         : Tail{};
  auto go = [&](auto kernel) {
    launch_dependent(kernel, grid, dim3(down_warps * 32), 0, act.ptr<float>(), ids.ptr<int32_t>(), weights.ptr<float>(),
                     ex.down.ptr<int64_t>(), out.ptr<float>(), int(K), int(H), int(I), tail);
  };
  if (then) go(moe_down_kernel<true>);
  else go(moe_down_kernel<false>);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
