// Top-k routing of one token by one warp, the logits held in registers (moe_topk and moe_route
// share it).
#pragma once

#include <cstdint>

#include "core/activations.cuh"
#include "core/arrival.cuh"

namespace revolta::cuda {

// Up to 32 x N experts: each lane keeps its logits in registers and a mask of what earlier rounds
// took, so the K rounds do not re-read memory (at decode sizes the rounds are the cost). A warp
// routes one token into its ids / weights row (K routed slots, then the shared expert's when S);
// kFromL2 reads logits other blocks of the same kernel wrote.
template <int N, bool kFromL2 = false>
__device__ void topk_registers_row(const float* l, int E, int K, int S, bool renorm, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float v[N];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {  // every load issued before any is used (lanes past E read E - 1)
    const int e = min(lane + 32 * i, E - 1);
    v[i] = kFromL2 ? load_l2(l + e) : l[e];
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (lane + 32 * i >= E) v[i] = -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i < E) sum += __expf(v[i] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  uint32_t taken = 0;  // bit i: expert lane + 32 i was picked (or does not exist)
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i >= E) taken |= 1u << i;
  float top = 0.0f;
  for (int k = 0; k < K; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < N; ++i)  // this lane's candidates rise in id: ties keep the first
      if (!(taken >> i & 1u) && (bi == 0x7fffffff || v[i] > bv)) bv = v[i], bi = lane + 32 * i;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i == bi) taken |= 1u << i;
    const float p = __expf(bv - mx) / sum;
    if (lane == 0) ids[k] = bi, weights[k] = p;
    top += p;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[k] /= top;
  if (S && lane == 0) {
    const float gate = kFromL2 ? load_l2(l + E) : l[E];
    ids[K] = E, weights[K] = sigmoid(gate);
  }
}

}  // namespace revolta::cuda
