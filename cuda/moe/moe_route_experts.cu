// ops::moe_route_experts on the device: a MoE block from the previous block's output to its own.
// A step of one token runs it as one cooperative kernel: every block of the experts' slice grid
// first takes a few rows of the router, then each block picks the token's experts itself from
// the logits the others wrote. Against moe_route + moe_experts this removes a kernel's drain and
// launch between the routing and the experts, and the round trip that read the chosen ids back;
// the shared expert's blocks need no routing at all and start at once (H200, Qwen3-Next shape, 32
// layers, concurrency 1, same run: 514.6 / 515.5 / 516.3 tok/s against 507.7 / 508.4 / 508.2 with
// the routing kernel and the slice kernel). Other batches run moe_route and moe_experts.
//
// Block b of the grid (slices x slots) before its wait loads, without using them, the address
// tables, the norm weight and rows [b * rows, (b + 1) * rows) of the router, a thread holding 8
// columns of each: when the block starts only after its predecessor has completed (the output
// projection's blocks hold the registers until they leave), a use would stall it a memory round
// trip before the block output's loads instead of beside them. After the wait: the residual and
// the block output's columns, the row's RMSNorm into shared memory (the experts' input), the
// block's logits. The logits go through exchange words that hold a logit's complement, so a zero
// word is one not yet written (no logit is the all-ones NaN): a routed block polls the row until
// every word is set, with no counter and fence between the writes and the reads (H200, Qwen3-Next
// shape, 32 layers, concurrency 1, same run: 532.8 / 535.1 tok/s against 519.6 / 517.3 with an
// arrival counter and a barrier, a summer per 64 columns and block 0 adding the residual), ranks it
// (topk_registers_with) and streams its slice of its expert; the shared expert's blocks poll only
// their gate's word, before their down rows. Block 0 writes the normed row and the ids / weights.
// The residual is left as it was: every block reads it after its wait, and the folded combine's
// last summer, which runs after every block has taken its ticket, adds the block output and the
// experts' output to it (in the order the two adds take), normalises it and zeroes the exchange.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "core/activations.cuh"
#include "core/arrival.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "moe/expert_slice.cuh"
#include "moe/topk_row.cuh"

namespace revolta::cuda {
RV_PROBE_TU();
namespace {

constexpr int kWarps = kSliceWarps, kColumns = kWarps * 32 * 8;  // a row of up to 2048 columns, 8 a thread
constexpr int kRouteRows = 4;                                     // router rows a block may take
constexpr int kMaxExperts = 32 * 16;                              // topk_registers_with<16>
static_assert(kFoldTickets + kMaxExperts + 1 <= kArrivalCounters / 2, "the exchange words fit the counters");
constexpr int kMaxSlots = 32;
constexpr int kCombineColumns = 16;  // a summer per 16 columns (sum_column_group)

// Bytes of the next block's weights warmed into L2 during the routing (REVOLTA_L2_WARM_MB, default
// 8, 0: none). H200, Qwen3-Next shape, 32 layers, concurrency 1, same run: 535.8 / 535.8 tok/s at
// 8 MB, 529.1 / 529.6 at 16, 516.7 / 515.3 at 32, 531.7 / 530.9 without; more than the routing's
// idle memory time covers probably competes with the experts' own stream. (Re-measured with the
// prefetches issued after the logits: 540.1-540.8 at 8 MB, 539.2 at 12, 537.3 at 16 in one run;
// 542.5-542.6 at 8, 541.6 at 6, 542.1 at 10 in another. Larger prefetches, 4 or 8 KB rather than
// 1 KB, lost 0.7% / 1.2%: 537.9-539.7 and 535.6-536.0.)
int64_t warm_bytes() {
  static const int64_t bytes = [] {
    const char* mb = std::getenv("REVOLTA_L2_WARM_MB");
    return (mb ? std::max(0L, std::atol(mb)) : 8L) << 20;
  }();
  return bytes;
}

struct Route {
  const float* y;       // the previous block's output [H]
  const float* router;  // f32 [E + shared, H]
  const float* residual;
  const float* norm_w;
  float eps;
  float* normed;
  int E, shared, K;  // experts, 1 with a shared expert (router row E is its gate), routed slots
  bool renorm;
  unsigned* exchange;  // [E + shared] complemented logits, zero until written
  int32_t* ids;        // [K + shared]
  float* weights;
  const char* warm;  // what the step reads next (warm_l2): chunks, every stride-th
  int warm_chunks, warm_stride;
};

constexpr int kTableLoads = int(kSharedTable) / (kWarps * 32);  // address-table entries a thread copies

template <int S>
__global__ void __launch_bounds__(kWarps * 32, 2)
    moe_route_slice_kernel(Route rt, const int64_t* __restrict__ gu_at, const int64_t* __restrict__ down_at,
                           int table_len, float* __restrict__ part, int H, int I, float* combined, Tail tail,
                           int* tickets) {
  RV_PROBE_BLOCK(ProbeKind::kMoeRouteExperts);
  extern __shared__ int64_t table[];  // [table_len] gate / up addresses, then [table_len] down ones
  __shared__ float4 xs[kColumns / 4];  // the normed row
  __shared__ float red[kWarps][kRouteRows + 1];
  __shared__ int32_t chosen_id[kMaxSlots];
  __shared__ float chosen_w[kMaxSlots];
  const int warp = threadIdx.x / 32;
  const int blocks = int(gridDim.x * gridDim.y), b = int(blockIdx.y * gridDim.x + blockIdx.x);
  const int R = rt.E + rt.shared, rows = (R + blocks - 1) / blocks, r0 = b * rows;
  const int c = threadIdx.x * 8;
  const bool live = c < H;
  const int cc = live ? c : 0;  // a thread past the row reads column 0 and weighs it 0
  int64_t gu_e[kTableLoads], dn_e[kTableLoads];
#pragma unroll
  for (int k = 0; k < kTableLoads; ++k) {
    const int e = int(threadIdx.x) + k * kWarps * 32;
    if (e < table_len) gu_e[k] = gu_at[e], dn_e[k] = down_at[e];
  }
  float nw[8], wv[kRouteRows][8];
  load8(rt.norm_w + cc, nw);
#pragma unroll
  for (int j = 0; j < kRouteRows; ++j)
    if (live && j < rows && r0 + j < R) load_weight8(rt.router + size_t(r0 + j) * H + cc, wv[j]);
  wait_for_predecessor();
  RV_PROBE_MARK(1);
  // The block output and the residual are written by earlier kernels (L2 loads, all four in flight).
  const float4 ya = load_l2(reinterpret_cast<const float4*>(rt.y + cc)), yb = load_l2(reinterpret_cast<const float4*>(rt.y + cc + 4));
  const float4 ra = load_l2(reinterpret_cast<const float4*>(rt.residual + cc)),
               rb = load_l2(reinterpret_cast<const float4*>(rt.residual + cc + 4));
#pragma unroll
  for (int k = 0; k < kTableLoads; ++k) {
    const int e = int(threadIdx.x) + k * kWarps * 32;
    if (e < table_len) table[e] = gu_e[k], table[table_len + e] = dn_e[k];
  }
#pragma unroll
  for (int j = 0; j < kRouteRows; ++j) {
    const bool mine = live && j < rows && r0 + j < R;
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[j][i] = mine ? wv[j][i] * nw[i] : 0.0f;
  }
  const float keep = live ? 1.0f : 0.0f;
  const float h[8] = {keep * (ya.x + ra.x), keep * (ya.y + ra.y), keep * (ya.z + ra.z), keep * (ya.w + ra.w),
                      keep * (yb.x + rb.x), keep * (yb.y + rb.y), keep * (yb.z + rb.z), keep * (yb.w + rb.w)};
  float ss = 0.0f, dot[kRouteRows] = {};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    ss += h[i] * h[i];
#pragma unroll
    for (int j = 0; j < kRouteRows; ++j) dot[j] += wv[j][i] * h[i];
  }
  warp_dots_and_squares(dot, ss, red[warp]);
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w][kRouteRows];
  const float inv = rsqrtf(total / float(H) + rt.eps);
  if (threadIdx.x < rows && r0 + int(threadIdx.x) < R) {
    float d = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) d += red[w][threadIdx.x];
    rt.exchange[r0 + threadIdx.x] = ~__float_as_uint(d * inv);
  }
  // The next block's weights into L2 once the logits are out: the memory is idle from here until
  // the experts are ranked, apart from the shared expert's blocks. A few prefetches a block, chunk
  // i by block i % blocks. (H200, Qwen3-Next shape, 32 layers, concurrency 1, same runs: 540.1 /
  // 540.8 / 540.8 and 542.2 / 542.4 / 542.2 tok/s against 522.8 / 524.2 / 522.0 and 525.2 / 526.2 /
  // 526.1 with them issued before the wait by the grid's first 32 blocks, a whole block's threads
  // each: those blocks' router rows came ~2 us behind every other block's, and every block waits
  // for all the logits. Spread the same way before the wait: 533.0 / 531.4 / 531.2; by warps 1.. of
  // the routed blocks while warp 0 polls: 535.0 / 534.7 / 535.1, its polls ~1.9 us slower.)
  warm_l2(rt.warm, rt.warm_chunks, rt.warm_stride, int(threadIdx.x) * blocks + b, blocks * int(blockDim.x));
  float n[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) n[i] = nw[i] * (h[i] * inv);
  if (live) xs[c / 4] = {n[0], n[1], n[2], n[3]}, xs[c / 4 + 1] = {n[4], n[5], n[6], n[7]};
  if (b == 0 && live) {
    *reinterpret_cast<float4*>(rt.normed + c) = {n[0], n[1], n[2], n[3]};
    *reinterpret_cast<float4*>(rt.normed + c + 4) = {n[4], n[5], n[6], n[7]};
  }
  __syncthreads();  // xs and the tables are in
  RV_PROBE_MARK(2);
  const int slot = int(blockIdx.y);
  const bool shared_slot = rt.shared && slot == rt.K;
  int expert = rt.E;
  if (!shared_slot) {
    if (warp == 0) {
      auto poll = [&](float (&v)[16], float& gate) {
        const int lane = threadIdx.x % 32;
        unsigned word[16], g = 1u;
        for (bool ready = false; !ready;) {
#pragma unroll
          for (int i = 0; i < 16; ++i) word[i] = load_polled(rt.exchange + min(lane + 32 * i, rt.E - 1));
          if (rt.shared) g = load_polled(rt.exchange + rt.E);
          bool set = g != 0u;
#pragma unroll
          for (int i = 0; i < 16; ++i) set = set && word[i] != 0u;
          ready = __all_sync(0xffffffffu, set);
        }
        RV_PROBE_MARK(3);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = __uint_as_float(~word[i]);
        gate = __uint_as_float(~g);
      };
      topk_registers_with<16>(poll, rt.E, rt.K, rt.shared, rt.renorm, chosen_id, chosen_w);
    }
    __syncthreads();
    if (b == 0 && int(threadIdx.x) < rt.K + rt.shared)
      rt.ids[threadIdx.x] = chosen_id[threadIdx.x], rt.weights[threadIdx.x] = chosen_w[threadIdx.x];
    expert = chosen_id[slot];
    RV_PROBE_MARK(4);
  }
  // The shared expert's gate is a logit of some other block: polled once its slice's rows are in.
  auto weight = [&] {
    if (!shared_slot) return chosen_w[slot];
    unsigned g;
    while ((g = load_polled(rt.exchange + rt.E)) == 0u) {
    }
    return sigmoid(__uint_as_float(~g));
  };
  const __half* dn = reinterpret_cast<const __half*>(table_len > 0 ? table[table_len + expert] : down_at[expert]);
  const __half* gu = reinterpret_cast<const __half*>(table_len > 0 ? table[expert] : gu_at[expert]);
  auto x8 = [&](int k, float (&xv)[8]) {
    split8(xs[k / 4], xs[k / 4 + 1], xv);
  };
  expert_slice<S>(gu, dn, x8, weight, part + size_t(b) * H, H, I, int(blockIdx.x) * S);
  RV_PROBE_MARK(6);
  fold_combine<kCombineColumns>(part, blocks, H, combined, tail, tickets, 0, rt.exchange, R);
}

}  // namespace

void moe_route_experts(const Tensor& x, const Tensor& router, int64_t E, bool renormalize, const ops::ResidualNorm& first,
                       Tensor& ids, Tensor& weights, const ops::ExpertTable& ex, Tensor& out,
                       const ops::ResidualNorm* then, const Tensor* warm) {
  const int64_t T = x.size(0), H = x.size(1), R = router.size(0), shared = R - E, slots = ids.size(1), I = ex.inter;
  auto aligned = [](const Tensor* t) { return reinterpret_cast<uintptr_t>(t->data()) % 16 == 0; };
  bool one_kernel = T == 1 && H % 8 == 0 && H <= kColumns && H == ex.hidden && E <= kMaxExperts && slots <= kMaxSlots &&
                    (shared == 0 || shared == 1) && slots > shared && router.dtype() == DType::kF32 &&
                    router.size(1) == H && x.dtype() == DType::kF32 && first.weight->dtype() == DType::kF32 &&
                    aligned(&x) && aligned(&router) && aligned(first.residual) && aligned(first.normed) &&
                    aligned(first.weight) && ex.dtype == DType::kF16 && ex.down_transposed && I % 8 == 0 &&
                    then && then->weight->dtype() == DType::kF32 && then->residual->data() == first.residual->data();
  // (The kernel leaves the residual to the last summer's norm, which adds both outputs: `then` on
  // the same residual, as the model passes it; otherwise the two kernels.)
  const int S = one_kernel ? slice_size(slots, I) : 0;
  const int64_t slices = one_kernel ? (I + S - 1) / S : 0, blocks = slices * slots;
  one_kernel = one_kernel && blocks * kRouteRows >= R;
  const int n_table = shared_table_len(ex);
  const size_t table_bytes = size_t(2 * n_table) * sizeof(int64_t);
  auto resident = [&](auto kernel) {  // the blocks wait for each other: all of them at once, or not this way
    return blocks <= int64_t(blocks_per_sm(reinterpret_cast<const void*>(kernel), kWarps * 32, table_bytes)) * sm_count();
  };
  auto go = [&](auto kernel) {
    if (!resident(kernel)) return false;
    Tensor part = Tensor::uninitialized({blocks, H}, DType::kF32, Device::kCUDA);
    int* const tickets = slice_tickets();
    Route rt{x.ptr<float>(), router.ptr<float>(), first.residual->ptr<float>(), first.weight->ptr<float>(),
             first.eps, first.normed->ptr<float>(), int(E), int(shared), int(slots - shared), renormalize,
             route_exchange(), ids.ptr<int32_t>(), weights.ptr<float>(), nullptr, 0, 1};
    if (warm && warm->device() == Device::kCUDA && warm_bytes() > 0) {  // spread evenly over the tensor
      const int64_t total = int64_t(warm->nbytes()) / kWarmChunk, cap = warm_bytes() / kWarmChunk;
      rt.warm = static_cast<const char*>(warm->data());
      rt.warm_stride = int(std::max<int64_t>(1, (total + cap - 1) / cap));
      rt.warm_chunks = int(total / rt.warm_stride);
    }
    Tail tail = tail_of(then);
    tail.before = x.ptr<float>();
    launch_with(true, true, kernel, dim3(unsigned(slices), unsigned(slots)), dim3(kWarps * 32), table_bytes, rt,
                ex.gate_up.ptr<int64_t>(), ex.down.ptr<int64_t>(), n_table, part.ptr<float>(), int(H), int(I),
                out.ptr<float>(), tail, tickets);
    RV_CUDA_CHECK(cudaGetLastError());
    return true;
  };
  bool launched = false;
  if (one_kernel) {
    if (S == 24) launched = go(moe_route_slice_kernel<24>);
    else if (S == 32) launched = go(moe_route_slice_kernel<32>);
    else if (S == 64) launched = go(moe_route_slice_kernel<64>);
    else launched = go(moe_route_slice_kernel<128>);
  }
  if (launched) return;
  revolta::cuda::moe_route(x, router, E, renormalize, ids, weights, &first);
  revolta::cuda::moe_experts(*first.normed, ids, weights, ex, out, then);
}

}  // namespace revolta::cuda
