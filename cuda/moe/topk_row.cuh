// Top-k routing of one token by one warp, the logits held in registers (moe_topk and moe_route
// share it).
#pragma once

#include <cstdint>

#include "core/activations.cuh"
#include "core/arrival.cuh"
#include "core/warp_reduce.cuh"

namespace revolta::cuda {

// The K largest of a warp's register-held logits (lane l, slot i: expert l + 32 i; -inf past E)
// by a threshold instead of K rounds of warp arg-max: the K-th largest lane maximum tau bounds the
// K-th largest logit from below (K lanes hold a value >= tau), so the top K are among the values
// >= tau, which are few; each of those is ranked against the others by (value desc, id asc), the
// order of the rounds. Writes win_v / win_i [K] in rank order and returns true; false (nothing
// written) when K > 32, the warp is past kThresholdWarps, or more than kCandidates values tie or
// cluster above tau, where the rounds take over.
constexpr int kThresholdWarps = 8, kCandidates = 64;

template <int N>
__device__ __forceinline__ bool topk_threshold(const float (&v)[N], int K, float* win_v, int* win_i) {
  __shared__ float cand_v[kThresholdWarps][kCandidates + 1];
  __shared__ int cand_i[kThresholdWarps][kCandidates + 1];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (K > 32 || warp >= kThresholdWarps) return false;
  float lane_max = v[0];
#pragma unroll
  for (int i = 1; i < N; ++i) lane_max = fmaxf(lane_max, v[i]);
  // The selection is a chain of warp steps run once per token, so its length is its cost: the
  // shuffles of a step are independent and fully unrolled they issue back to back (a loop of
  // four at a time measured 970 cycles for this rank alone on the H200, the smem ranking of the
  // candidates 1,860).
  int rank = 0;  // of this lane's maximum among the lanes'
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float o = __shfl_sync(0xffffffffu, lane_max, j);
    rank += int(o > lane_max) | (int(o == lane_max) & int(j < lane));
  }
  const unsigned at = __ballot_sync(0xffffffffu, rank == K - 1);
  const float tau = __shfl_sync(0xffffffffu, lane_max, __ffs(at) - 1);
  int mine = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) mine += v[i] >= tau;
  int upto = mine;  // inclusive prefix over the lanes
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, upto, o);
    if (lane >= o) upto += t;
  }
  const int total = __shfl_sync(0xffffffffu, upto, 31);
  if (total > kCandidates) return false;
  int pos = upto - mine;
#pragma unroll
  for (int i = 0; i < N; ++i) {  // branch-free: what is not a candidate goes to the spare slot
    const bool take = v[i] >= tau;
    const int slot = take ? pos : kCandidates;
    cand_v[warp][slot] = v[i], cand_i[warp][slot] = lane + 32 * i;
    pos += take;
  }
  __syncwarp();
  if (total <= 32) {  // the usual case: a candidate per lane, ranked against the others by shuffles
    const int c = min(lane, total - 1);
    const float cv = cand_v[warp][c];
    const int ci = cand_i[warp][c];
    int r = 0;
#pragma unroll
    for (int q = 0; q < 32; ++q) {  // bitwise: short-circuit forms compiled to branches (2.8x slower)
      const float ov = __shfl_sync(0xffffffffu, cv, q);
      const int oi = __shfl_sync(0xffffffffu, ci, q);
      r += int(q < total) & (int(ov > cv) | (int(ov == cv) & int(oi < ci)));
    }
    if (lane < total && r < K) win_v[r] = cv, win_i[r] = ci;
  } else {
    for (int c = lane; c < total; c += 32) {
      const float cv = cand_v[warp][c];
      const int ci = cand_i[warp][c];
      int r = 0;
      for (int q = 0; q < total; ++q) {
        const float ov = cand_v[warp][q];
        const int oi = cand_i[warp][q];
        r += ov > cv || (ov == cv && oi < ci);
      }
      if (r < K) win_v[r] = cv, win_i[r] = ci;
    }
  }
  __syncwarp();
  return true;
}

// Up to 32 x N experts: each lane keeps its logits in registers (at decode sizes the selection,
// not the memory, is the cost). A warp routes one token into its ids / weights row (K routed
// slots, then the shared expert's when S). load(v, gate) fills the lane's logits (lane l, slot i:
// expert l + 32 i; lanes past E read any expert, masked here) and the shared expert's gate logit.
// Blocks of at most kThresholdWarps warps (a warp's winners go to its row of shared memory).
// The weights come from the winners alone: the largest logit is the first winner, and with
// renormalisation the softmax's denominator cancels, so only without it is the whole row summed.
template <int N, typename Load>
__device__ void topk_registers_with(Load load, int E, int K, int S, bool renorm, int32_t* ids, float* weights) {
  __shared__ float win_v[kThresholdWarps][32];
  __shared__ int win_i[kThresholdWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, w = warp % kThresholdWarps;
  float v[N], gate = 0.0f;
  load(v, gate);
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i >= E) v[i] = -INFINITY;
  if (!topk_threshold<N>(v, K, win_v[w], win_i[w])) {  // K rounds of warp arg-max
    uint32_t taken = 0;  // bit i: expert lane + 32 i was picked (or does not exist)
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i >= E) taken |= 1u << i;
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
      if (lane == 0 && k < 32) win_v[w][k] = bv, win_i[w][k] = bi;
      else if (lane == 0) ids[k] = bi, weights[k] = bv;  // past 32 winners: raw logits, scaled below
    }
    __syncwarp();
  }
  const float mx = win_v[w][0];
  float sum = 1.0f;  // the softmax's denominator over exp(l - mx), when renorm does not cancel it
  if (!renorm) {
    sum = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i < E) sum += __expf(v[i] - mx);
    sum = warp_sum(sum);
  }
  float top = 0.0f, mine = 0.0f;  // mine: slot `lane`'s probability
  for (int k0 = 0; k0 < K; k0 += 32) {
    const int k = k0 + lane;
    const float p = k < K ? __expf((k < 32 ? win_v[w][k] : weights[k]) - mx) / sum : 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {  // in slot order, as the rounds add
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (k0 + j < K) top += pj;
    }
    if (k0 == 0) mine = p;
    else if (k < K) weights[k] = p;
  }
  if (lane < K) ids[lane] = win_i[w][lane], weights[lane] = renorm ? mine / top : mine;
  if (K > 32 && renorm) {
    __syncwarp();
    for (int k = 32 + lane; k < K; k += 32) weights[k] /= top;
  }
  if (S && lane == 0) ids[K] = E, weights[K] = sigmoid(gate);
}

// topk_registers_with over logits in memory; kFromL2 reads logits other blocks of the same kernel
// wrote.
template <int N, bool kFromL2 = false>
__device__ void topk_registers_row(const float* l, int E, int K, int S, bool renorm, int32_t* ids, float* weights) {
  auto load = [&](float (&v)[N], float& gate) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < N; ++i) {  // every load issued before any is used (lanes past E read E - 1)
      const int e = min(lane + 32 * i, E - 1);
      v[i] = kFromL2 ? load_l2(l + e) : l[e];
    }
    if (S) gate = kFromL2 ? load_l2(l + E) : l[E];  // with the others: not a round trip of its own
  };
  topk_registers_with<N>(load, E, K, S, renorm, ids, weights);
}

}  // namespace revolta::cuda
