// Mixture of experts over 4-bit group weights (ops::moe_experts with a kI4G32 / kI4G128 table,
// gemm/int4_words.cuh). The table holds each expert as the checkpoint does: gate / up [2 inter,
// hidden] and down [hidden, inter], groups running along each row's inputs.
// Decode-sized batches, two kernels with the ids on the device (a graph captures them):
//  1. gate / up: a warp per (pair, P intermediates) dots the gate and up rows of its pair's expert
//     with the token's x, act[pair, i] = silu(gate) up;
//  2. down: a warp per (token, hidden row h) dots row h of each slot's down matrix with that slot's
//     act, S slots at a time, and sums them times their routing weights in slot order (the
//     result does not depend on timing); with a residual norm the token's last block adds the row
//     to the residual stream and normalises it.
// Larger batches: the experts some token picked are dequantized to f16 in a scratch buffer, whose
// table moe_experts' grouped tensor-core GEMMs take (down as [hidden, inter]).
#include <cuda_fp16.h>

#include "core/activations.cuh"
#include "core/arrival.cuh"
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "cuda_ops.h"
#include "gemm/int4_words.cuh"
#include "moe/expert_slice.cuh"
#include "moe/moe_int4.h"
#include "quant/int4_groups.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 8, kGateRows = 2;
// The down kernel's inputs (every slot's act row of its token) in shared memory up to this size.
constexpr int64_t kStagedBytes = 48 << 10;

// Block (16 intermediates, pair); x staged in shared memory while the first rows load. G: the group
// size.
template <int G>
__global__ void __launch_bounds__(kWarps * 32)
    int4_gate_up_kernel(const float* __restrict__ x, const int32_t* __restrict__ ids, const int64_t* __restrict__ gu_at,
                        float* __restrict__ act, int K, int H, int I) {
  extern __shared__ float4 staged[];
  float* xs = reinterpret_cast<float*>(staged);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pair = blockIdx.y;
  const int i0 = (blockIdx.x * kWarps + warp) * kGateRows;
  wait_for_predecessor();  // ids and x come from the kernels before
  const auto* w = reinterpret_cast<const uint8_t*>(gu_at[ids[pair]]);
  if (w == nullptr) {  // another rank's expert (expert parallelism): its act is 0
    if (lane == 0)
      for (int p = 0; p < kGateRows; ++p)
        if (i0 + p < I) act[size_t(pair) * I + i0 + p] = 0.0f;
    return;
  }
  const size_t rb = size_t(H / Int4Block<G>::kValues) * Int4Block<G>::kBytes;
  const uint8_t* rows[2 * kGateRows];
#pragma unroll
  for (int p = 0; p < kGateRows; ++p) {
    const int i = min(i0 + p, I - 1);  // rows past I recompute row I - 1, not stored
    rows[2 * p] = w + size_t(i) * rb, rows[2 * p + 1] = w + size_t(I + i) * rb;
  }
  float d[2 * kGateRows];
  int4_warp_dots<G, 2 * kGateRows, 4>(
      rows, [&](int, int k, float(&v)[8]) { shared8(xs + k, v); },
      [&] { stage_inputs(x + size_t(pair / K) * H, xs, H); }, H, lane, d);
  let_successor_launch();
  if (lane == 0)
#pragma unroll
    for (int p = 0; p < kGateRows; ++p)
      if (i0 + p < I) act[size_t(pair) * I + i0 + p] = silu(d[2 * p]) * d[2 * p + 1];
}

// Block (8 hidden rows, token). S: slots whose rows are in flight at once; kStaged: the token's act
// rows staged in shared memory while the first rows load.
template <int G, int S, bool kStaged, bool kTail>
__global__ void __launch_bounds__(kWarps * 32, 2)
    int4_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids, const float* __restrict__ weights,
                     const int64_t* __restrict__ down_at, float* __restrict__ out, int K, int H, int I, Tail tail) {
  extern __shared__ float4 staged[];
  float* acts = reinterpret_cast<float*>(staged);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = blockIdx.y;
  const int h = min(int(blockIdx.x) * kWarps + warp, H - 1);  // rows past H recompute row H - 1, not stored
  wait_for_predecessor();
  const size_t rb = size_t(I / Int4Block<G>::kValues) * Int4Block<G>::kBytes;
  const float* token_act = act + size_t(t) * K * I;
  // A slot whose expert another rank holds has act 0: it reads a held expert's row in its place (a
  // finite row times 0 adds 0). A token with none here adds nothing.
  const uint8_t* held = nullptr;
  for (int k = 0; k < K && !held; ++k) held = reinterpret_cast<const uint8_t*>(down_at[ids[t * K + k]]);
  float sum = 0.0f;
  for (int k0 = 0; k0 < K && held; k0 += S) {
    const uint8_t* rows[S];
    int slot[S];
#pragma unroll
    for (int r = 0; r < S; ++r) {
      slot[r] = min(k0 + r, K - 1);  // slots past K recompute the last, not added
      const auto* d = reinterpret_cast<const uint8_t*>(down_at[ids[t * K + slot[r]]]);
      rows[r] = (d ? d : held) + size_t(h) * rb;
    }
    float d[S];
    auto x8 = [&](int r, int k, float(&v)[8]) {
      if constexpr (kStaged) shared8(acts + size_t(slot[r]) * I + k, v);
      else load8_input(token_act + size_t(slot[r]) * I + k, v);
    };
    auto ready = [&] {
      if (kStaged && k0 == 0) stage_inputs(token_act, acts, K * I);
    };
    int4_warp_dots<G, S, 2>(rows, x8, ready, I, lane, d);
#pragma unroll
    for (int r = 0; r < S; ++r)
      if (k0 + r < K) sum += weights[t * K + k0 + r] * d[r];
  }
  if (lane == 0 && int(blockIdx.x) * kWarps + warp < H) out[size_t(t) * H + h] = sum;
  let_successor_launch();
  if (kTail && last_to_arrive(tail.counters + t, int(gridDim.x)))
    residual_norm_row(tail.residual + size_t(t) * H, out + size_t(t) * H, tail.weight, tail.eps,
                      tail.normed + size_t(t) * H, H);
}

// Block (chunk, expert): the expert's [N, K] blocks as f16 into dst + expert * stride, if some
// token picked it; table[expert] = its address either way.
__global__ void int4_expert_dequantize_kernel(const int32_t* __restrict__ counts, const int64_t* __restrict__ at,
                                              __half* dst, int64_t stride, int64_t* __restrict__ table, int N, int K,
                                              int group, int bb) {
  const int e = blockIdx.y;
  __half* d = dst + size_t(e) * stride;
  if (blockIdx.x == 0 && threadIdx.x == 0) table[e] = int64_t(reinterpret_cast<intptr_t>(d));
  if (counts[e] == 0) return;
  const auto* w = reinterpret_cast<const uint8_t*>(at[e]);
  const size_t rb = size_t(K / (4 * group)) * bb;
  const int64_t words = int64_t(N) * K / 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (K / 8);
    const int col = int(i % (K / 8)) * 8;
    const Int4Row r{w + row * rb, group, bb};
    *reinterpret_cast<uint4*>(d + row * K + col) = int4_word_halves(r.word(col), r.head(col));
  }
}

template <int G>
void decode_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& act,
                    Tensor& out, const ops::ResidualNorm* then) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter;
  const dim3 gate_grid(unsigned((I + kWarps * kGateRows - 1) / (kWarps * kGateRows)), unsigned(T * K));
  launch_dependent(int4_gate_up_kernel<G>, gate_grid, dim3(kWarps * 32), size_t(H) * sizeof(float), x.ptr<float>(),
                   ids.ptr<int32_t>(), ex.gate_up.ptr<int64_t>(), act.ptr<float>(), int(K), int(H), int(I));
  RV_CUDA_CHECK(cudaGetLastError());
  const dim3 grid(unsigned((H + kWarps - 1) / kWarps), unsigned(T));
  const size_t staged = size_t(K * I) * sizeof(float);
  auto down = [&](auto kernel, size_t smem) {
    launch_dependent(kernel, grid, dim3(kWarps * 32), smem, act.ptr<float>(), ids.ptr<int32_t>(), weights.ptr<float>(),
                     ex.down.ptr<int64_t>(), out.ptr<float>(), int(K), int(H), int(I), tail_of(then));
  };
  auto slots = [&](auto plain, auto tail, auto plain_global, auto tail_global) {
    if (int64_t(staged) <= kStagedBytes) then ? down(tail, staged) : down(plain, staged);
    else then ? down(tail_global, 0) : down(plain_global, 0);
  };
#define RV_DOWN(s)                                                                                                 \
  slots(int4_down_kernel<G, s, true, false>, int4_down_kernel<G, s, true, true>, int4_down_kernel<G, s, false, false>, \
        int4_down_kernel<G, s, false, true>)
  // Slots a warp's pass holds: the fewest passes, then the fewest rows recomputed past K.
  if (K <= 4) RV_DOWN(4);
  else if (K <= 8) RV_DOWN(8);
  else RV_DOWN(6);
#undef RV_DOWN
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool is_int4_table(const ops::ExpertTable& ex) { return ex.dtype == DType::kI4G32 || ex.dtype == DType::kI4G128; }

void moe_experts_int4(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& out,
                      const ops::ResidualNorm* then) {
  const int64_t T = x.size(0), K = ids.size(1), H = ex.hidden, I = ex.inter;
  const int group = int(int4_group_size(ex.dtype));
  RV_CHECK(!ex.down_transposed && H % (4 * group) == 0 && I % (4 * group) == 0,
           "CUDA moe_experts: 4-bit experts need down as [hidden, inter] and whole blocks of ", 4 * group, " values");
  RV_CHECK(H * int64_t(sizeof(float)) <= kStagedBytes, "CUDA moe_experts: 4-bit experts of hidden size up to ",
           kStagedBytes / int64_t(sizeof(float)), " (got ", H, ")");
  RV_CHECK(!then || T <= kArrivalCounters, "CUDA moe_experts: at most ", kArrivalCounters, " tokens with a residual norm");
  Tensor act = Tensor::uninitialized({T * K, I}, DType::kF32, Device::kCUDA);
  if (group == 32) decode_experts<32>(x, ids, weights, ex, act, out, then);
  else decode_experts<128>(x, ids, weights, ex, act, out, then);
}

ops::ExpertTable dequantize_used_experts(const ops::ExpertTable& ex, const Tensor& counts, Tensor& scratch) {
  const int64_t E = ex.gate_up.numel(), H = ex.hidden, I = ex.inter;
  const int group = int(int4_group_size(ex.dtype)), bb = int(dtype_bytes(ex.dtype, 4 * group));
  scratch = Tensor::uninitialized({E, 3 * I * H}, DType::kF16, Device::kCUDA);
  ops::ExpertTable f16{Tensor::uninitialized({E}, DType::kI64, Device::kCUDA),
                       Tensor::uninitialized({E}, DType::kI64, Device::kCUDA), DType::kF16, H, I, false};
  __half* base = scratch.ptr<__half>();
  // Each expert's [gate; up] then its down in one run of the scratch.
  const int64_t stride = 3 * I * H;
  int4_expert_dequantize_kernel<<<dim3(64, unsigned(E)), 256, 0, stream()>>>(
      counts.ptr<int32_t>(), ex.gate_up.ptr<int64_t>(), base, stride, f16.gate_up.ptr<int64_t>(), int(2 * I), int(H), group, bb);
  RV_CUDA_CHECK(cudaGetLastError());
  int4_expert_dequantize_kernel<<<dim3(64, unsigned(E)), 256, 0, stream()>>>(counts.ptr<int32_t>(), ex.down.ptr<int64_t>(),
                                                                             base + 2 * I * H, stride, f16.down.ptr<int64_t>(),
                                                                             int(H), int(I), group, bb);
  RV_CUDA_CHECK(cudaGetLastError());
  return f16;
}

}  // namespace revolta::cuda
