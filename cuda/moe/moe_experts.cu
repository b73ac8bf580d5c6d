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
#include "moe/expert_slice.cuh"
#include "moe/moe_int4.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = kSliceWarps, kCombineColumns = 64;

// Block (column group, token): one column group of the combine (sum_column_group). With a
// residual norm (kTail), the token's last block adds the row to the residual stream and
// normalises it.
template <bool kTail>
__global__ void __launch_bounds__(kWarps * 32)
    moe_combine_kernel(const float* __restrict__ part, int parts, int H, float* out, Tail tail) {
  enter_dependent();
  const int t = blockIdx.y;
  sum_column_group<kCombineColumns>(part, parts, H, out, t, int(blockIdx.x));
  if (kTail && last_to_arrive(tail.counters + t, int(gridDim.x)))
    residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                      tail.normed + size_t(t) * H, H);
}

// Block (slice, pair): expert_slice for the pair's expert, into part[pair * slices + slice].
// With table_len > 0 (dependent launch, a table of up to kSharedTable experts) the block copies
// the expert address tables into shared memory before its wait, so that after it an expert's
// addresses are one shared-memory read behind its id instead of another L2 round trip.
template <int S, bool kFold>
__global__ void __launch_bounds__(kWarps * 32, 2)
    moe_slice_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                     const int64_t* __restrict__ gu_at, const int64_t* __restrict__ down_at, int table_len,
                     float* __restrict__ part, int K, int H, int I, float* combined, Tail tail, int* tickets) {
  extern __shared__ int64_t table[];  // [table_len] gate / up addresses, then [table_len] down ones
  for (int e = threadIdx.x; e < table_len; e += kWarps * 32) table[e] = gu_at[e], table[table_len + e] = down_at[e];
  wait_for_predecessor();
  if (table_len > 0) __syncthreads();
  const int pair = blockIdx.y, t = pair / K, expert = ids[pair];
  const __half* dn = reinterpret_cast<const __half*>(table_len > 0 ? table[table_len + expert] : down_at[expert]);
  const __half* gu = reinterpret_cast<const __half*>(table_len > 0 ? table[expert] : gu_at[expert]);
  const float* xt = x + size_t(t) * H;
  expert_slice<S>(gu, dn, [xt](int k, float (&xv)[8]) { load8_input(xt + k, xv); }, [&] { return weights[pair]; },
                  part + (size_t(pair) * gridDim.x + blockIdx.x) * H, H, I, int(blockIdx.x) * S);
  if (kFold) fold_combine<kCombineColumns>(part, K * int(gridDim.x), H, combined, tail, tickets, t);
}

constexpr int64_t kFusedTokens = 64, kGroupedSliceTokens = 2048;

// Pairs whose expert the table leaves null (another rank's) are not counted, nor placed.
__global__ void count_kernel(const int32_t* __restrict__ ids, int P, const int64_t* __restrict__ gu_at,
                             int32_t* __restrict__ counts) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p < P && gu_at[ids[p]] != 0) atomicAdd(counts + ids[p], 1);
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

__global__ void scatter_kernel(const int32_t* __restrict__ ids, int P, int K, const int64_t* __restrict__ gu_at,
                               const int32_t* __restrict__ row_first, int32_t* __restrict__ cursor,
                               int32_t* __restrict__ rows, int32_t* __restrict__ pos_of) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= P) return;
  if (gu_at[ids[p]] == 0) {
    pos_of[p] = -1;
    return;
  }
  const int e = ids[p], pos = row_first[e] + atomicAdd(cursor + e, 1);
  rows[pos] = p / K;
  pos_of[p] = pos;
}

__global__ void combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ pos_of,
                               const float* __restrict__ weights, int K, int H, float* __restrict__ out) {
  const int t = blockIdx.x;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int pos = pos_of[t * K + k];
      if (pos >= 0) sum += weights[t * K + k] * y[size_t(pos) * H + d];
    }
    out[size_t(t) * H + d] = sum;
  }
}

// The tokens of x (a slice of at most kGroupedSliceTokens) grouped by expert on the device; 4-bit
// experts are read from their f16 copies (dequantize_used_experts).
void grouped_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& table, Tensor& out) {
  const int64_t T = x.size(0), K = ids.size(1), H = table.hidden, I = table.inter, P = T * K, G = table.gate_up.numel();
  const Device dev = Device::kCUDA;
  Tensor counts = Tensor::empty({G}, DType::kI32, dev);  // zeroed
  Tensor row_first = Tensor::uninitialized({G + 1}, DType::kI32, dev), tile_first = Tensor::uninitialized({G + 1}, DType::kI32, dev);
  Tensor cursor = Tensor::uninitialized({G}, DType::kI32, dev), rows = Tensor::uninitialized({P}, DType::kI32, dev);
  Tensor pos_of = Tensor::uninitialized({P}, DType::kI32, dev);
  const unsigned blocks = unsigned((P + 255) / 256);
  count_kernel<<<blocks, 256, 0, stream()>>>(ids.ptr<int32_t>(), int(P), table.gate_up.ptr<int64_t>(), counts.ptr<int32_t>());
  plan_kernel<<<1, 32, 0, stream()>>>(counts.ptr<int32_t>(), int(G), row_first.ptr<int32_t>(), tile_first.ptr<int32_t>(),
                                      cursor.ptr<int32_t>());
  scatter_kernel<<<blocks, 256, 0, stream()>>>(ids.ptr<int32_t>(), int(P), int(K), table.gate_up.ptr<int64_t>(),
                                               row_first.ptr<int32_t>(),
                                               cursor.ptr<int32_t>(), rows.ptr<int32_t>(), pos_of.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
  Tensor scratch;
  const ops::ExpertTable ex = is_int4_table(table) ? dequantize_used_experts(table, counts, scratch) : table;
  const int max_tiles = int((P + kGroupedTileRows - 1) / kGroupedTileRows + G);
  tc::Groups groups{row_first.ptr<int32_t>(), tile_first.ptr<int32_t>(), ex.gate_up.ptr<int64_t>(), rows.ptr<int32_t>(), int(G)};
  Tensor gu = Tensor::uninitialized({P, 2 * I}, DType::kF32, dev), act = Tensor::uninitialized({P, I}, DType::kF32, dev);
  grouped_gemm(x.ptr<float>(), groups, max_tiles, gu.ptr<float>(), int(2 * I), int(H));
  silu_mul(gu, act);
  groups.weights = ex.down.ptr<int64_t>();
  groups.rows = nullptr;  // act is already in grouped order
  Tensor y = Tensor::uninitialized({P, H}, DType::kF32, dev);
  grouped_gemm(act.ptr<float>(), groups, max_tiles, y.ptr<float>(), int(H), int(I), /*weights_kn=*/ex.down_transposed);
  combine_kernel<<<unsigned(T), 256, 0, stream()>>>(y.ptr<float>(), pos_of.ptr<int32_t>(), weights.ptr<float>(), int(K),
                                                    int(H), out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& out,
                 const ops::ResidualNorm* then) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter;
  if (T > 0 && T <= kFusedTokens && is_int4_table(ex)) return moe_experts_int4(x, ids, weights, ex, out, then);
  RV_CHECK((ex.dtype == DType::kF16 || is_int4_table(ex)) && H % 8 == 0 && I % 8 == 0 && x.size(1) == H,
           "CUDA moe_experts: float16 or 4-bit experts with hidden and intermediate sizes divisible by 8 (got ",
           dtype_name(ex.dtype), ", ", H, ", ", I, ")");
  RV_CHECK(ex.down_transposed != is_int4_table(ex), "CUDA moe_experts: down matrices stored transposed, [inter, hidden] ",
           "(4-bit experts: as [hidden, inter])");
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
  const int S = slice_size(T * K, I);
  const int64_t slices = (I + S - 1) / S;
  Tensor part = Tensor::uninitialized({T * K * slices, H}, DType::kF32, Device::kCUDA);
  const Tail tail = tail_of(then);
  // The combine folds into the slice kernel when every block of its grid is resident at once.
  auto fits = [&](auto kernel, size_t smem) {
    const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarps * 32, smem);
    return T * K * slices <= int64_t(per_sm) * sm_count() && 2 * T <= kFoldTickets;
  };
  int* const tickets = slice_tickets();
  // The tables go to shared memory only with the whole grid resident (the combine folds then too):
  // a second wave's blocks would copy after the wait (concurrency 8, H200: 1052.0 / 1051.8 against
  // 1058.0 / 1057.9).
  const int n_table = shared_table_len(ex);
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
