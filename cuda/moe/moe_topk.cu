// MoE routing on the device: one warp per token; softmax statistics over the experts, then the K
// largest (ties to the lower expert id, as on the CPU). Up to 512 experts (Qwen3-Next) the logits
// stay in registers and a threshold picks the few candidates to rank (topk_row.cuh); more experts
// take K rounds of a warp arg-max, each excluding what earlier rounds took and reading the logits
// again.
#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "cuda_ops.h"
#include "core/arrival.cuh"
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

// Decode routing in one launch: a warp per router row computes the logits of the M tokens (f32
// router, 16-byte loads), then the last block to finish runs the top-k, a warp per token.
template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    route_kernel(const float* __restrict__ x, const float* __restrict__ router, float* logits, int E, int S, int H,
                 int K, bool renorm, int32_t* __restrict__ ids, float* __restrict__ weights, int* counter) {
  const int lane = threadIdx.x % 32, r = blockIdx.x * kWarps + threadIdx.x / 32, R = E + S;
  if (r < R)  // this warp's router row (f32), a 128-byte line per lane in turn
    for (int b = lane * 32; b < H; b += 32 * 32) prefetch_weights_l2(router + size_t(r) * H + b);
  wait_for_predecessor();
  if (r < R) {  // no early return: every thread reaches the arrival count
    float acc[M] = {};
    const float* w = router + size_t(r) * H;
    for (int k = lane * 8; k < H; k += 32 * 8) {  // H % 8 == 0 (checked by the caller)
      float wv[8];
      load_weight8(w + k, wv);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[8];
        load8(x + size_t(m) * H + k, xv);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wv[i] * xv[i];
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
}

}  // namespace

void moe_route(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t T = x.size(0), H = x.size(1), R = router.size(0), S = R - E, K = ids.size(1) - S;
  RV_CHECK(router.size(1) == H && (S == 0 || S == 1) && K >= 1 && K <= E, "CUDA moe_route: x ", x.shape_str(),
           " router ", router.shape_str(), " for ", E, " experts, ids ", ids.shape_str());
  if (T == 0) return;
  Tensor logits = Tensor::uninitialized({T, R}, DType::kF32, Device::kCUDA);
  const bool fused = T <= 4 && E <= 32 * 16 && H % 8 == 0 && router.dtype() == DType::kF32 &&
                     reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && reinterpret_cast<uintptr_t>(router.data()) % 16 == 0;
  if (!fused) {
    linear(x, router, nullptr, logits);
    moe_topk(logits, E, renormalize, ids, weights);
    return;
  }
  const unsigned blocks = unsigned((R + kWarps - 1) / kWarps);
  auto go = [&](auto kernel) {
    launch_dependent(kernel, dim3(blocks), dim3(kWarps * 32), 0, x.ptr<float>(), router.ptr<float>(), logits.ptr<float>(),
                     int(E), int(S), int(H), int(K), renormalize, ids.ptr<int32_t>(), weights.ptr<float>(),
                     arrival_counters());
  };
  switch (T) {
    case 1: go(route_kernel<1>); break;
    case 2: go(route_kernel<2>); break;
    case 3: go(route_kernel<3>); break;
    default: go(route_kernel<4>); break;
  }
  RV_CUDA_CHECK(cudaGetLastError());
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
