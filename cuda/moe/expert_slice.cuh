// The decode experts' slice work and its folded combine, shared by the slice kernels of
// moe_experts and moe_route_experts (moe_experts.cu says how the work is split).
#pragma once

#include <cuda_fp16.h>

#include "core/activations.cuh"
#include "core/arrival.cuh"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "gemm/row_dots.cuh"
#include "norms/residual_norm_tail.cuh"

namespace revolta::cuda {

constexpr int kSliceWarps = 8;

struct Tail {
  float* residual;
  const float* weight;
  float eps;
  float* normed;
  int* counters;  // one per token
  // moe_route_experts: the block output whose add into the residual the routing left to this norm
  const float* before = nullptr;
};

// Column group `group` (C columns) of token t: out[t, cols] = the sum of the token's `parts`
// partial rows, taken in a fixed order (row groups of C / 4 lanes x float4, folded by shuffles
// within a warp, then the warps in order), so the result does not depend on block timing. By a
// whole block of kSliceWarps warps. Narrow groups make more summers, each a round trip less deep:
// 16 columns take a token's 242 partial rows at concurrency 1 in one round trip of 4 a thread (H200,
// Qwen3-Next shape, same run: 520.8 against 518.1 tok/s with 64); a batch's folds, where a token has
// fewer partial rows than the row has 16-column groups, keep 64 (concurrency 8: 1062.5 against 1041.0).
template <int C>
__device__ __forceinline__ void sum_column_group(const float* __restrict__ part, int parts, int H, float* out, int t,
                                                 int group) {
  constexpr int kQuads = C / 4, kRowGroups = kSliceWarps * 32 / kQuads, kBatch = 8;
  static_assert(kQuads <= 32 && 32 % kQuads == 0, "a warp holds whole row groups");
  __shared__ float4 sums[kSliceWarps][kQuads];
  const int rg = threadIdx.x / kQuads, q = threadIdx.x % kQuads, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = group * C + q * 4;
  const bool live = col < H;  // H % 8 == 0: a float4 is all in or all out
  const float* rows = part + size_t(t) * parts * H + (live ? col : 0);
  float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int r = rg; r < parts; r += kBatch * kRowGroups) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = r + b * kRowGroups;
      // L2 loads: other blocks wrote these rows (the read-only path is for data no kernel writes)
      v[b] = row < parts ? load_l2(reinterpret_cast<const float4*>(rows + size_t(row) * H)) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) acc.x += v[b].x, acc.y += v[b].y, acc.z += v[b].z, acc.w += v[b].w;
  }
#pragma unroll
  for (int o = kQuads; o < 32; o <<= 1) {  // the warp's row groups, a fixed butterfly
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, o), acc.y += __shfl_xor_sync(0xffffffffu, acc.y, o);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, o), acc.w += __shfl_xor_sync(0xffffffffu, acc.w, o);
  }
  if (lane < kQuads) sums[warp][lane] = acc;
  __syncthreads();
  if (threadIdx.x < kQuads && live) {
    float4 s = sums[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < kSliceWarps; ++w) {
      const float4 v = sums[w][threadIdx.x];
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    *reinterpret_cast<float4*>(out + size_t(t) * H + col) = s;
  }
  __syncthreads();  // sums is reused by the next group
}

// The combine folded into the slice kernel (kFold): every block of token t takes a ticket once
// its partial row is out; the last `summers` blocks of the token wait for all of its partial rows
// (every block of the grid is resident: the host folds only then) and sum a column group each, so
// the kernel after the experts follows the slices directly instead of a short combine kernel
// between them. The last summer runs the residual norm; it also re-arms the two counters and
// zeroes `exchange` (words the blocks read before their tickets).
template <int C>
__device__ __forceinline__ void fold_combine(const float* part, int parts, int H, float* out, const Tail& tail,
                                             int* tickets, int t, unsigned* exchange = nullptr, int exchange_len = 0) {
  __shared__ int ticket;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(tickets + 2 * t, 1);
  __syncthreads();
  RV_PROBE_MARK(8);
  const int groups = (H + C - 1) / C, summers = min(groups, parts);
  const int first = parts - summers;
  if (ticket < first) return;
  if (threadIdx.x == 0) {
    while (load_polled(tickets + 2 * t) < parts) {
    }
    __threadfence();
  }
  __syncthreads();
  RV_PROBE_MARK(9);
  for (int g = ticket - first; g < groups; g += summers) sum_column_group<C>(part, parts, H, out, t, g);
  RV_PROBE_MARK(10);
  __threadfence();
  if (threadIdx.x == 0) {
    last = atomicAdd(tickets + 2 * t + 1, 1) == summers - 1;
    if (last) tickets[2 * t] = 0, tickets[2 * t + 1] = 0;  // every summer is past its wait
  }
  __syncthreads();
  if (!last) return;
  for (int e = threadIdx.x; e < exchange_len; e += blockDim.x) exchange[e] = 0u;
  if (!tail.residual) return;
  __threadfence();
  residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                    tail.normed + size_t(t) * H, H, tail.before ? tail.before + size_t(t) * H : nullptr);
}

// A block's slice of its expert (see moe_slice_kernel): act[i] for the S intermediates i0 + [0, S)
// (rows past I give 0), then out[h] = weight() * sum_i act[i] * down_t[i, h] for every h. x8(k, xv)
// reads the token's input; weight() is asked for only once the gate / up rows are in, so a kernel
// that routes may still be settling the weight until then.
// In the down pass each thread owns 8 columns of each pass over the row (a pass covers
// kPassColumns) and reads them from each of the slice's S rows: a warp's load is 512 contiguous
// bytes, and the sums stay in registers. The first kFirstRows rows of the first pass are loaded
// before the gate / up rows (they do not depend on the activation), so the block's bytes keep
// streaming across the hand-over; the rest go kDownBatch rows at a time.
// An expert the table leaves null (another rank's, under expert parallelism) gives a zero row.
template <int S, typename X8, typename Weight>
__device__ __forceinline__ void expert_slice(const __half* gu, const __half* dn, X8 x8, Weight weight, float* out,
                                             int H, int I, int i0) {
  if (gu == nullptr) {
    let_successor_launch();
    for (int h = int(threadIdx.x) * 4; h < H; h += int(blockDim.x) * 4) *reinterpret_cast<float4*>(out + h) = {0.0f, 0.0f, 0.0f, 0.0f};
    return;
  }
  constexpr int kPerWarp = S / kSliceWarps, kGroup = kPerWarp < 4 ? kPerWarp : 4;  // intermediates a warp dots at once
  constexpr int kPassColumns = kSliceWarps * 32 * 8, kFirstRows = 8, kDownBatch = 8;
  static_assert(S % kDownBatch == 0 && S >= kFirstRows, "slice rows in whole batches");
  __shared__ float act[S];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Row j of the slice at column h (rows past I re-read row I - 1, whose act is 0; columns past H
  // re-read the row's last 8, whose sums are not stored).
  auto down_row = [&](int j, int h) { return dn + size_t(min(i0 + j, I - 1)) * H + min(h, H - 8); };
  const int h_first = threadIdx.x * 8;
  uint4 first[kFirstRows];
#pragma unroll
  for (int r = 0; r < kFirstRows; ++r) first[r] = load_weight_raw8(down_row(r, h_first));
#pragma unroll
  for (int q = 0; q < kPerWarp; q += kGroup) {
    const int j0 = warp * kPerWarp + q;  // within the slice
    const __half* wg[kGroup];
    const __half* wu[kGroup];
#pragma unroll
    for (int p = 0; p < kGroup; ++p) {
      const int i = min(i0 + j0 + p, I - 1);  // rows past I recompute row I - 1; their act is 0
      wg[p] = gu + size_t(i) * H, wu[p] = gu + size_t(I + i) * H;
    }
    float g[kGroup] = {}, u[kGroup] = {};
    paired_row_dots_with<kGroup, 8 / kGroup>(wg, wu, x8, H, lane, g, u);
#pragma unroll
    for (int p = 0; p < kGroup; ++p) {
      const float gv = warp_sum(g[p]), uv = warp_sum(u[p]);
      if (lane == 0) act[j0 + p] = i0 + j0 + p < I ? silu(gv) * uv : 0.0f;
    }
  }
  __syncthreads();
  RV_PROBE_MARK(5);
  let_successor_launch();  // the next kernel's blocks may take their places while the down rows stream
  const float wk = weight();
  float sum[8];
  auto add_row = [&](const uint4& raw, int j) { axpy8(act[j], raw, sum); };
  auto rows_from = [&](int j0, int h) {  // rows [j0, S) of the pass at column h
#pragma unroll 1
    for (int j = j0; j < S; j += kDownBatch) {
      uint4 w[kDownBatch];
#pragma unroll
      for (int r = 0; r < kDownBatch; ++r) w[r] = load_weight_raw8(down_row(j + r, h));
#pragma unroll
      for (int r = 0; r < kDownBatch; ++r) add_row(w[r], j + r);
    }
  };
  auto store = [&](int h) {
    if (h >= H) return;
    *reinterpret_cast<float4*>(out + h) = make_float4(wk * sum[0], wk * sum[1], wk * sum[2], wk * sum[3]);
    *reinterpret_cast<float4*>(out + h + 4) = make_float4(wk * sum[4], wk * sum[5], wk * sum[6], wk * sum[7]);
  };
#pragma unroll
  for (int e = 0; e < 8; ++e) sum[e] = 0.0f;
#pragma unroll
  for (int r = 0; r < kFirstRows; ++r) add_row(first[r], r);
  rows_from(kFirstRows, h_first);
  store(h_first);
  for (int h = h_first + kPassColumns; h < H; h += kPassColumns) {
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] = 0.0f;
    rows_from(0, h);
    store(h);
  }
}

// The narrowest slice that keeps a grid of `pairs` x slices within two blocks per multiprocessor
// (all resident at once): a block streams its bytes as a chain of round trips, so more, smaller
// blocks finish sooner; a second wave, or fewer blocks, cost more than the extra partial rows.
// (24 rather than 32 at one token on the H200, 242 blocks against 176: 452.9 against 444.9 tok/s.)
inline int slice_size(int64_t pairs, int64_t I) {
  for (const int s : {24, 32, 64})
    if (pairs * ((I + s - 1) / s) <= 2 * sm_count()) return s;
  return 128;
}

// Address tables of up to kSharedTable experts go to shared memory (see moe_slice_kernel), and only
// with dependent launch, where every block's copy overlaps its wait: the entries a block copies.
constexpr int64_t kSharedTable = 1024;
inline int shared_table_len(const ops::ExpertTable& ex) {
  return dependent_launch_enabled() && ex.gate_up.numel() <= kSharedTable ? int(ex.gate_up.numel()) : 0;
}

// The folded combine's residual norm (`then`), or none.
inline Tail tail_of(const ops::ResidualNorm* then) {
  return then ? Tail{then->residual->ptr<float>(), then->weight->ptr<float>(), then->eps, then->normed->ptr<float>(),
                     arrival_counters()}
              : Tail{};
}

// The folded combine's tickets, two a token: a region of the arrival counters no other kernel
// uses; after them the words moe_route_experts exchanges its logits through.
constexpr int kFoldTickets = 1024;
inline int* slice_tickets() { return arrival_counters() + kArrivalCounters / 2; }
inline unsigned* route_exchange() { return reinterpret_cast<unsigned*>(slice_tickets() + kFoldTickets); }

}  // namespace revolta::cuda
