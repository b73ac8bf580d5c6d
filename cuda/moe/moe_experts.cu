// Decode-sized mixture of experts (ops::moe_experts): the routed ids stay on the device and each
// (token, slot) pair finds its expert's matrices through the layer's address table, so a decode
// step needs no copy to the host and can be captured in a graph. The table holds down transposed
// ([inter, hidden]), so every block's share of an expert is three contiguous runs of bytes.
//  1. slices: a block per (pair, S intermediates) computes act = silu(gate . x) * (up . x) for its
//     slice into shared memory, then the slice's share of every hidden column, act . down_t[slice],
//     times the pair's routing weight, into a partial row of its own. One kernel streams all of a
//     step's expert bytes: the down rows of a finished slice are read while other slices still
//     read gate / up rows, instead of a second kernel that waits for every activation. (One H200 run:
//     439.6 tok/s at concurrency 1 and 1010.9 at 8, against 432.9 and 957.3 with down as [hidden,
//     inter], where a slice read 2 x S bytes out of every hidden row.)
//  2. combine: a block per 64 hidden columns of a token sums the token's partial rows in a fixed
//     order; with a residual norm, the token's last block adds the row to the residual stream and
//     normalises it. (Summing inside the slice kernel, by the last slice of a pair and then the
//     last pair of a token, measured slower: 392 against 424 tok/s at concurrency 1 on the H200.)
// Weight rows stream with 16-byte loads; a pair reads its expert once, which is what a decode step
// of a few tokens costs anyway.
//
// Past kFusedTokens tokens (prefill) the pairs are grouped by expert on the device (a count, a
// scan, a scatter) and each expert's rows go through tensor-core tiles in one grouped GEMM per
// matrix (gemm_tensor_core.cuh); a last pass sums each token's slots in slot order, so the result
// does not depend on the order the scatter's atomics gave the rows.
#include <cuda_fp16.h>

#include <algorithm>

#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "gemm/gemm_tensor_core.cuh"
#include "gemm/row_dots.cuh"
#include "norms/residual_norm_tail.cuh"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 8;

struct Tail {
  float* residual;
  const float* weight;
  float eps;
  float* normed;
  int* counters;  // one per token
};

// Column group `group` (64 columns) of token t: out[t, cols] = the sum of the token's `parts`
// partial rows, taken in a fixed order (16 row groups of 16 lanes x float4, then the groups in
// order), so the result does not depend on block timing. By a whole block of kWarps warps.
constexpr int kCombineColumns = 64, kCombineGroups = kWarps * 32 / (kCombineColumns / 4);

__device__ __forceinline__ void sum_column_group(const float* __restrict__ part, int parts, int H, float* out, int t,
                                                 int group) {
  __shared__ float4 sums[kCombineGroups][kCombineColumns / 4];
  const int rg = threadIdx.x / (kCombineColumns / 4), q = threadIdx.x % (kCombineColumns / 4);
  const int col = group * kCombineColumns + q * 4;
  const bool live = col < H;  // H % 8 == 0: a float4 is all in or all out
  const float* rows = part + size_t(t) * parts * H + (live ? col : 0);
  float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
  constexpr int kBatch = 8;  // a token's 242 partial rows at concurrency 1: two round trips per thread
  for (int r = rg; r < parts; r += kBatch * kCombineGroups) {
    float4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int row = r + b * kCombineGroups;
      // L2 loads: other blocks wrote these rows (the read-only path is for data no kernel writes)
      v[b] = row < parts ? load_l2(reinterpret_cast<const float4*>(rows + size_t(row) * H)) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) acc.x += v[b].x, acc.y += v[b].y, acc.z += v[b].z, acc.w += v[b].w;
  }
  sums[rg][q] = acc;
  __syncthreads();
  if (threadIdx.x < kCombineColumns / 4 && live) {
    float4 s = sums[0][threadIdx.x];
#pragma unroll
    for (int g = 1; g < kCombineGroups; ++g) {
      const float4 v = sums[g][threadIdx.x];
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
// between them. The last summer runs the residual norm; it also re-arms the two counters.
__device__ __forceinline__ void fold_combine(const float* part, int parts, int H, float* out, const Tail& tail,
                                             int* tickets, int t) {
  __shared__ int ticket;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) ticket = atomicAdd(tickets + 2 * t, 1);
  __syncthreads();
  const int groups = (H + kCombineColumns - 1) / kCombineColumns, summers = min(groups, parts);
  const int first = parts - summers;
  if (ticket < first) return;
  if (threadIdx.x == 0) {
    while (*static_cast<volatile int*>(tickets + 2 * t) < parts) {
    }
    __threadfence();
  }
  __syncthreads();
  for (int g = ticket - first; g < groups; g += summers) sum_column_group(part, parts, H, out, t, g);
  __threadfence();
  if (threadIdx.x == 0) {
    last = atomicAdd(tickets + 2 * t + 1, 1) == summers - 1;
    if (last) tickets[2 * t] = 0, tickets[2 * t + 1] = 0;  // every summer is past its wait
  }
  __syncthreads();
  if (!last || !tail.residual) return;
  __threadfence();
  residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                    tail.normed + size_t(t) * H, H);
}

// Block (column group, token): one column group of the combine (sum_column_group). With a
// residual norm (kTail), the token's last block adds the row to the residual stream and
// normalises it.
template <bool kTail>
__global__ void __launch_bounds__(kWarps * 32)
    moe_combine_kernel(const float* __restrict__ part, int parts, int H, float* out, Tail tail) {
  enter_dependent();
  const int t = blockIdx.y;
  sum_column_group(part, parts, H, out, t, int(blockIdx.x));
  if (kTail && last_to_arrive(tail.counters + t, int(gridDim.x)))
    residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                      tail.normed + size_t(t) * H, H);
}

// Block (slice, pair): act[i] for the S intermediates i0 + [0, S) of the pair's expert (rows past I
// give 0), then part[pair * slices + slice][h] = weight * sum_i act[i] * down_t[i, h] for every h.
// In the down pass each thread owns 8 columns of each pass over the row (a pass covers
// kPassColumns) and reads them from each of the slice's S rows: a warp's load is 512 contiguous
// bytes, and the sums stay in registers. The first kFirstRows rows of the first pass are loaded
// before the gate / up rows (they do not depend on the activation), so the block's bytes keep
// streaming across the hand-over; the rest go kDownBatch rows at a time.
// With table_len > 0 (dependent launch, a table of up to kSharedTable experts) the block copies
// the expert address tables into shared memory before its wait, so that after it an expert's
// addresses are one shared-memory read behind its id instead of another L2 round trip.
template <int S, bool kFold>
__global__ void __launch_bounds__(kWarps * 32, 2)
    moe_slice_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                     const int64_t* __restrict__ gu_at, const int64_t* __restrict__ down_at, int table_len,
                     float* __restrict__ part, int K, int H, int I, float* combined, Tail tail, int* tickets) {
  constexpr int kPerWarp = S / kWarps, kGroup = kPerWarp < 4 ? kPerWarp : 4;  // intermediates a warp dots at once
  constexpr int kPassColumns = kWarps * 32 * 8, kFirstRows = 8, kDownBatch = 8;
  static_assert(S % kDownBatch == 0 && S >= kFirstRows, "slice rows in whole batches");
  __shared__ float act[S];
  extern __shared__ int64_t table[];  // [table_len] gate / up addresses, then [table_len] down ones
  for (int e = threadIdx.x; e < table_len; e += kWarps * 32) table[e] = gu_at[e], table[table_len + e] = down_at[e];
  wait_for_predecessor();
  if (table_len > 0) __syncthreads();
  const int pair = blockIdx.y, t = pair / K, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = blockIdx.x * S, expert = ids[pair];
  const __half* dn = reinterpret_cast<const __half*>(table_len > 0 ? table[table_len + expert] : down_at[expert]);
  // Row j of the slice at column h (rows past I re-read row I - 1, whose act is 0; columns past H
  // re-read the row's last 8, whose sums are not stored).
  auto down_row = [&](int j, int h) { return dn + size_t(min(i0 + j, I - 1)) * H + min(h, H - 8); };
  const int h_first = threadIdx.x * 8;
  uint4 first[kFirstRows];
#pragma unroll
  for (int r = 0; r < kFirstRows; ++r) first[r] = load_weight_raw8(down_row(r, h_first));

  const __half* gu = reinterpret_cast<const __half*>(table_len > 0 ? table[expert] : gu_at[expert]);
  const float* xt = x + size_t(t) * H;
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
    paired_row_dots<kGroup, 8 / kGroup>(wg, wu, xt, H, lane, g, u);
#pragma unroll
    for (int p = 0; p < kGroup; ++p) {
      const float gv = warp_sum(g[p]), uv = warp_sum(u[p]);
      if (lane == 0) act[j0 + p] = i0 + j0 + p < I ? silu(gv) * uv : 0.0f;
    }
  }
  __syncthreads();
  let_successor_launch();  // the next kernel's blocks may take their places while the down rows stream
  const float wk = weights[pair];
  float* out = part + (size_t(pair) * gridDim.x + blockIdx.x) * H;
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
  if (kFold) fold_combine(part, K * int(gridDim.x), H, combined, tail, tickets, t);
}

constexpr int64_t kFusedTokens = 64, kGroupedSliceTokens = 2048, kSharedTable = 1024;

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
  grouped_gemm(act.ptr<float>(), groups, max_tiles, y.ptr<float>(), int(H), int(I), /*weights_kn=*/true);
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
  RV_CHECK(ex.down_transposed, "CUDA moe_experts: down matrices stored transposed, [inter, hidden]");
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
  RV_CHECK(!then || (then->weight->dtype() == DType::kF32 && T <= kArrivalCounters),
           "CUDA moe_experts: a float32 norm weight and at most ", kArrivalCounters, " tokens with a residual norm");
  // The narrowest slice that keeps the grid within two blocks per multiprocessor (all resident at
  // once): a block streams its bytes as a chain of round trips, so more, smaller blocks finish
  // sooner; a second wave, or fewer blocks, cost more than the extra partial rows. (24 rather than
  // 32 at one token on the H200, 242 blocks against 176: 452.9 against 444.9 tok/s.)
  int S = 128;
  for (const int s : {24, 32, 64})
    if (T * K * ((I + s - 1) / s) <= 2 * sm_count()) {
      S = s;
      break;
    }
  const int64_t slices = (I + S - 1) / S;
  Tensor part = Tensor::uninitialized({T * K * slices, H}, DType::kF32, Device::kCUDA);
  const Tail tail = then ? Tail{then->residual->ptr<float>(), then->weight->ptr<float>(), then->eps,
                                then->normed->ptr<float>(), arrival_counters()}
                         : Tail{};
  // The combine folds into the slice kernel when every block of its grid is resident at once.
  auto fits = [&](auto kernel, size_t smem) {
    const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarps * 32, smem);
    return T * K * slices <= int64_t(per_sm) * sm_count() && 2 * T <= kArrivalCounters / 2;
  };
  int* const tickets = arrival_counters() + kArrivalCounters / 2;  // a region no other kernel uses
  // The address tables go to shared memory only where every block's copy overlaps the wait: with
  // dependent launch, and the whole grid resident (the combine folds then too). A second wave's
  // blocks would copy after the wait (concurrency 8, H200: 1052.0 / 1051.8 against 1058.0 / 1057.9).
  const int n_table = dependent_launch_enabled() && ex.gate_up.numel() <= kSharedTable ? int(ex.gate_up.numel()) : 0;
  bool folded = false;
  auto slice = [&](auto plain, auto fold) {
    folded = fits(fold, size_t(2 * n_table) * sizeof(int64_t));
    const int table_len = folded ? n_table : 0;
    const size_t table_bytes = size_t(2 * table_len) * sizeof(int64_t);
    const dim3 grid{unsigned(slices), unsigned(T * K)};
    // Folded, the summers wait for every block of the grid: a cooperative launch, so that a device
    // shared with other work fails it rather than hangs (as gdn_decode's group wait does).
    launch_with(true, folded, folded ? fold : plain, grid, dim3(kWarps * 32), table_bytes, x.ptr<float>(),
                ids.ptr<int32_t>(), weights.ptr<float>(), ex.gate_up.ptr<int64_t>(), ex.down.ptr<int64_t>(), table_len,
                part.ptr<float>(), int(K), int(H), int(I), out.ptr<float>(), tail, tickets);
  };
  if (S == 24) slice(moe_slice_kernel<24, false>, moe_slice_kernel<24, true>);
  else if (S == 32) slice(moe_slice_kernel<32, false>, moe_slice_kernel<32, true>);
  else if (S == 64) slice(moe_slice_kernel<64, false>, moe_slice_kernel<64, true>);
  else slice(moe_slice_kernel<128, false>, moe_slice_kernel<128, true>);
  RV_CUDA_CHECK(cudaGetLastError());
  if (folded) return;
  auto combine = [&](auto kernel) {
    launch_dependent(kernel, dim3{unsigned((H + kCombineColumns - 1) / kCombineColumns), unsigned(T)}, dim3(kWarps * 32),
                     0, part.ptr<float>(), int(K * slices), int(H), out.ptr<float>(), tail);
  };
  if (then) combine(moe_combine_kernel<true>);
  else combine(moe_combine_kernel<false>);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
