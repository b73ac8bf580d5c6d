// ops::gdn_decode on the device: a DeltaNet block from its fused projection to its normed output in
// one kernel for decode batches (the separate conv, split / L2 norm, gates, delta rule and gated
// norm kernels of a decode step were each latency-bound).
//
// A block per (value head, 32 x CPT state columns, sequence), so a decode step of one token keeps
// Hv * Dv / 32 multiprocessors busy (128 for Qwen3-Next) and each moves only its 32 columns of the
// fp32 state; larger batches take 128 columns a block (CPT = 4), which repeats the q / k conv of a
// key head fewer times. 8 warps split the Dk state rows, RPT per thread; a lane holds CPT columns
// 32 apart. Per token: conv + silu of the key head's q and k channels and of the block's v channels
// into shared memory, the q / k L2 norms and the head's gates, then the rule; the output before its
// norm goes to `out`.
// The blocks of a key head's group (its value heads x column groups) all compute the same q / k
// conv from the same old conv window, so none may overwrite it while another reads it: the last of
// the group to arrive (core/arrival.cuh) writes the q / k windows back and applies the gated
// RMSNorm to the group's output rows, which spans the column groups.
// With `squares` (the deferred norm, ops::gdn_decode) each block gates its own output columns and
// writes the sums of their squares instead, and the output projection finishes the RMS
// (ops::linear_scaled), so no block waits for the rest of its head.
// A step of one token also computes its input projection here (kProject): the blocks of a key
// head's group split the group's rows of the projection (its q / k channels and its value heads'
// v, z, b and a columns), write them to `fused` and wait for each other on a group counter, so the
// step has no projection kernel whose completion every block would wait for. The group's blocks
// must all be resident at once (a cooperative launch). A second copy of the grid (helpers) streams
// half of the rows and leaves; without room for both copies the projection stays a GEMV of its own.
// (H200, Qwen3-Next shape, 32 layers, concurrency 1, same run: 452.4 / 452.8 / 452.2 tok/s against
// 447.1 / 445.6 / 441.0 with the projection as a kernel of its own.)
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "core/activations.cuh"
#include "core/arrival.cuh"
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "gemm/row_dots.cuh"

namespace revolta::cuda {
RV_PROBE_TU();
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kMaxW = 8, kMaxDv = 256;

struct Shape {
  int Hk, Dk, Hv, Dv, W, width, C;
};

// Group member `member` of `members`: its share of key head hk's rows of the input projection
// (q and k channels, then the group's v, z, b and a columns), two consecutive rows per warp at a
// time, into fused row 0. The warps of a block cover 16 consecutive rows per round. An odd last
// row of the share is split by columns over the whole block, its loads issued with the first
// round's: as a pair of its own it took one warp a round trip more than every other warp of the
// group, and the group waits for its slowest warp (Qwen3-Next: 772 rows over 16 members, 48 or 49).
__device__ __forceinline__ void project_group_rows(const float* __restrict__ x, const __half* __restrict__ proj,
                                                   int hidden, float* fused, const Shape& sh, int hk, int R,
                                                   int member, int members) {
  const int Dk = sh.Dk, RV = R * sh.Dv, n = 2 * Dk + 2 * RV + 2 * R;
  const int begin = member * n / members, end = (member + 1) * n / members, paired = begin + (end - begin) / 2 * 2;
  auto row_of = [&](int j) {
    if (j < 2 * Dk) return (j < Dk ? hk : sh.Hk + hk - 1) * Dk + j;
    j -= 2 * Dk;
    if (j < RV) return 2 * sh.Hk * Dk + hk * RV + j;
    j -= RV;
    if (j < RV) return sh.C + hk * RV + j;
    j -= RV;  // b columns, then a columns
    return sh.C + sh.Hv * sh.Dv + (j < R ? hk * R + j : sh.Hv + hk * R + j - R);
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool odd = paired < end;
  const __half* const odd_row = proj + size_t(row_of(odd ? paired : begin)) * hidden;
  const int k0 = threadIdx.x * 8;  // the odd row: 8 columns a thread, kThreads * 8 a step
  const uint4 first = odd && k0 < hidden ? load_weight_raw8(odd_row + k0) : uint4{};
  for (int j = begin + 2 * warp; j < paired; j += 2 * kWarps) {
    const int ra = row_of(j), rb = row_of(j + 1);
    const __half* const wa[1] = {proj + size_t(ra) * hidden};
    const __half* const wb[1] = {proj + size_t(rb) * hidden};
    float a[1] = {}, b[1] = {};
    paired_row_dots<1, 8>(wa, wb, x, hidden, lane, a, b);
    a[0] = warp_sum(a[0]), b[0] = warp_sum(b[0]);
    if (lane == 0) fused[ra] = a[0], fused[rb] = b[0];
  }
  if (!odd) return;  // (uniform over the block)
  float xv[8], d = 0.0f;
  if (k0 < hidden) load8_input(x + k0, xv), d = dot8(first, xv);
  for (int k = k0 + kThreads * 8; k < hidden; k += kThreads * 8) load8_input(x + k, xv), d += dot8(load_weight_raw8(odd_row + k), xv);
  __shared__ float odd_part[kWarps];
  d = warp_sum(d);
  if (lane == 0) odd_part[warp] = d;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += odd_part[w];
    fused[row_of(paired)] = sum;
  }
}

// RPT state rows per thread (Dk = kWarps * RPT), CPT columns per lane; kProject: one token of one
// sequence, whose projection this kernel computes from x (fused is then written here, so its reads
// skip L1).
#define GDN_DECODE_PARAMS                                                                                      \
  const float *x, const __half *__restrict__ proj, int hidden, float *fused, const float *__restrict__ conv_w,    \
      const float *__restrict__ neg_a, const float *__restrict__ dt_bias, const float *__restrict__ norm_w,       \
      float norm_eps, float *__restrict__ conv_states, float *__restrict__ states,                                \
      const int32_t *__restrict__ starts, const int32_t *__restrict__ slots, float *out, float *squares,         \
      int *counters, Shape sh
template <int RPT, int CPT, bool kProject, bool kSquares>
__device__ __forceinline__ void gdn_decode_block(GDN_DECODE_PARAMS) {
  constexpr int Dk = kWarps * RPT, kCols = 32 * CPT;
  const int Dv = sh.Dv, groups = (Dv + kCols - 1) / kCols, R = sh.Hv / sh.Hk;
  // kProject grids may hold copies of the block set past the first: helpers that compute a share
  // of their group's projection rows and leave.
  const int blocks = sh.Hv * groups, copy = kProject ? blockIdx.x / blocks : 0, b = blockIdx.x % blocks;
  const int h = b / groups, cg = b % groups, hk = h / R, s = blockIdx.y;
  const int members = R * groups * (kProject ? gridDim.x / blocks : 1), member = (copy * R + h - hk * R) * groups + cg;
  // kProject: S == 1, so the group counters of the norm below are counters[0, Hk) and those of
  // the projection's hand-over counters[Hk, 2 Hk); the norm's last block re-arms the latter.
  int* const group_ready = counters + sh.Hk + hk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int col[CPT];  // this lane's columns of the head
  bool has_col[CPT];
#pragma unroll
  for (int c = 0; c < CPT; ++c) col[c] = cg * kCols + 32 * c + lane, has_col[c] = col[c] < Dv;
  const int out_width = sh.Hv * Dv;
  __shared__ float xq[Dk], xk[Dk], xv[kCols];  // this token's conv outputs
  __shared__ float red[kWarps][kCols];
  __shared__ float scal[2];  // 1 / |q| * scale, 1 / |k|
  // The last W - 1 inputs of the channels this block convolves: q, k of key head hk, its v columns.
  __shared__ float window[2 * Dk + kCols][kMaxW - 1];
  __shared__ float taps[2 * Dk + kCols][kMaxW];  // their conv weights
  // The deferred norm (ops::gdn_decode's squares): a sum per 32 columns of the head, this block's from cg * CPT.
  const int parts = (Dv + 31) / 32;
  auto square_at = [&](int t, int c) { return (size_t(t) * sh.Hv + h) * parts + cg * CPT + c; };
  // The projected form takes the deferred norm from its arguments: compiled in as a constant, its
  // RPT 16 form (Qwen3-Next) spilled 60 bytes and lost ~2% at concurrency 1.
  const bool deferred = kProject ? squares != nullptr : kSquares;
  const int t0 = starts[s], t1 = starts[s + 1], slot = slots[s];
  if (slot < 0) {  // a padding row (every block of the group returns here): no state, zero output
    wait_for_predecessor();
    if (copy > 0) return;
    for (int t = t0; t < t1; ++t)
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        if (warp == 0 && has_col[c]) out[size_t(t) * out_width + h * Dv + col[c]] = 0.0f;
        if (deferred && threadIdx.x == 0 && cg * kCols + 32 * c < Dv) squares[square_at(t, c)] = 0.0f;
      }
    return;
  }
  const int nch = 2 * Dk + min(kCols, Dv - cg * kCols);
  auto channel = [&](int c) {
    return c < Dk ? hk * Dk + c : c < 2 * Dk ? (sh.Hk + hk) * Dk + c - Dk : 2 * sh.Hk * Dk + h * Dv + cg * kCols + c - 2 * Dk;
  };
  auto conv_state = [&](int c) { return conv_states + (size_t(slot) * sh.C + channel(c)) * (sh.W - 1); };
  // Loops over the taps are unrolled to kMaxW so that their loads are in flight together: the
  // kernel is a chain of memory round trips, and each one saved is a fraction of a microsecond.
  float* S = states + (size_t(slot) * sh.Hv + h) * Dk * Dv;
  float st[RPT][CPT];
  auto load_state = [&] {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
      for (int c = 0; c < CPT; ++c) st[r][c] = has_col[c] ? S[size_t(warp * RPT + r) * Dv + col[c]] : 0.0f;
  };
  if (!kProject) load_state();  // kProject: after the projection's rows, which want the registers
  for (int c = copy > 0 ? nch : threadIdx.x; c < nch; c += kThreads) {  // (helpers skip it)
    const float* src = conv_state(c);
    const float* wc = conv_w + size_t(channel(c)) * sh.W;
    float v[kMaxW - 1], wv[kMaxW];
#pragma unroll
    for (int i = 0; i < kMaxW - 1; ++i) v[i] = i < sh.W - 1 ? src[i] : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxW; ++i) wv[i] = i < sh.W ? wc[i] : 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxW - 1; ++i) window[c][i] = v[i];
#pragma unroll
    for (int i = 0; i < kMaxW; ++i) taps[c][i] = wv[i];
  }
  const float head_neg_a = neg_a[h], head_dt_bias = dt_bias[h];
  // Everything above (the batch layout, this layer's weights, state and conv windows, last written
  // by the previous step) was read while the input projection drained; its output is read from here on.
  // The narrow form (small steps: one or two tokens at Qwen3-Next's shape, about one block per
  // multiprocessor) lets the output projection in now: its blocks fit beside this kernel's and
  // load their first weights while this one runs its chain of round trips. The wide form fills
  // the device, so its successor waits for its reads.
  if (CPT == 1 && !kProject) let_successor_launch();
  wait_for_predecessor();
  RV_PROBE_MARK(1);
  if (kProject) {
    project_group_rows(x, proj, hidden, fused, sh, hk, R, member, members);
    if (copy > 0) {  // a helper: its rows are out
      __syncthreads();
      if (threadIdx.x == 0) __threadfence(), atomicAdd(group_ready, 1);
      return;
    }
    RV_PROBE_MARK(2);
    load_state();
    arrive_and_wait(group_ready, members);
    RV_PROBE_MARK(3);
    let_successor_launch();
  }
  auto in = [](const float* p) { return kProject ? load_l2(p) : load_input(p); };  // a value of fused
  const float scale = rsqrtf(float(Dk));
  for (int t = t0; t < t1; ++t) {
    const float* row = fused + size_t(t) * sh.width;
    // The head's gate inputs (b, then a columns), loaded by every thread with the conv inputs.
    const int first = sh.C + sh.Hv * Dv;
    const float b_in = in(row + first + h), a_in = in(row + first + sh.Hv + h);
    // The deferred norm: the output gate's inputs and the norm weight of warp 0's columns, loaded with the
    // others (through shared memory, the wait for them before the conv cost 0.25% at concurrency 1).
    float z[CPT], gain[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      const bool used = deferred && warp == 0 && has_col[c];
      z[c] = used ? in(row + sh.C + h * Dv + col[c]) : 0.0f, gain[c] = used ? norm_w[col[c]] : 0.0f;
    }
    for (int c = threadIdx.x; c < nch; c += kThreads) {  // conv + silu, window shifted
      float* win = window[c];
      const float xt = in(row + channel(c));
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxW; ++i)
        if (i < sh.W) acc += taps[c][i] * (i == sh.W - 1 ? xt : i < kMaxW - 1 ? win[i] : 0.0f);
#pragma unroll
      for (int i = 0; i + 1 < kMaxW - 1; ++i)
        if (i + 1 < sh.W - 1) win[i] = win[i + 1];
      if (sh.W > 1) win[sh.W - 2] = xt;
      const float y = silu(acc);
      if (c < Dk) xq[c] = y;
      else if (c < 2 * Dk) xk[c - Dk] = y;
      else xv[c - 2 * Dk] = y;
    }
    __syncthreads();
    if (warp < 2) {  // L2 norms of q (warp 0) and k (warp 1)
      const float* x = warp == 0 ? xq : xk;
      float ss = 0.0f;
      for (int i = lane; i < Dk; i += 32) ss += x[i] * x[i];
      ss = warp_sum(ss);
      if (lane == 0) scal[warp] = rsqrtf(ss + 1e-6f) * (warp == 0 ? scale : 1.0f);
    }
    const float b = sigmoid(b_in), decay = __expf(head_neg_a * softplus(a_in + head_dt_bias));
    __syncthreads();
    const float qn = scal[0], kn = scal[1];
    float part[CPT] = {};
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        st[r][c] *= decay;
        part[c] += xk[warp * RPT + r] * kn * st[r][c];
      }
#pragma unroll
    for (int c = 0; c < CPT; ++c) red[warp][32 * c + lane] = part[c];
    __syncthreads();
    float delta[CPT], o[CPT] = {};
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      float kv = 0.0f;
#pragma unroll
      for (int g = 0; g < kWarps; ++g) kv += red[g][32 * c + lane];
      delta[c] = has_col[c] ? (xv[32 * c + lane] - kv) * b : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        st[r][c] += xk[warp * RPT + r] * kn * delta[c];
        o[c] += xq[warp * RPT + r] * qn * st[r][c];
      }
    __syncthreads();  // red is read by everyone
#pragma unroll
    for (int c = 0; c < CPT; ++c) red[warp][32 * c + lane] = o[c];
    __syncthreads();
    if (warp == 0)  // the output before its norm: read back by the group's last block, or gated and summed
#pragma unroll
      for (int c = 0; c < CPT; ++c) {
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < kWarps; ++g) sum += red[g][32 * c + lane];
        if (deferred) {
          const float sq = warp_sum(has_col[c] ? sum * sum : 0.0f);
          if (lane == 0 && cg * kCols + 32 * c < Dv) squares[square_at(t, c)] = sq;
          sum *= gain[c] * silu(z[c]);
        }
        if (has_col[c]) out[size_t(t) * out_width + h * Dv + col[c]] = sum;
      }
  }
  RV_PROBE_MARK(4);
  if (CPT != 1) let_successor_launch();  // what is left are stores and the group's norm
  // The group's last block reads only the outputs above: the arrival's fence waits for those
  // stores alone, and the state and window stores go out after it (the next step reads them once
  // this kernel has completed).
  // With squares no block reads another's output. The projected form's blocks have all read the
  // old q / k windows before they met on the group counter, so its group's first block stores them
  // and the last to leave re-arms the counter; the other forms still take the last to arrive, the
  // one that knows that nobody reads the old windows any more.
  const bool last = deferred && kProject ? false : last_to_arrive(counters + size_t(s) * sh.Hk + hk, R * groups);
  RV_PROBE_MARK(5);
#pragma unroll
  for (int r = 0; r < RPT; ++r)
#pragma unroll
    for (int c = 0; c < CPT; ++c)
      if (has_col[c]) S[size_t(warp * RPT + r) * Dv + col[c]] = st[r][c];
  auto store_windows = [&](int from, int to) {
    for (int c = from + threadIdx.x; c < to; c += kThreads)
      for (int i = 0; i < sh.W - 1; ++i) conv_state(c)[i] = window[c][i];
  };
  store_windows(2 * Dk, nch);  // this block's own v channels
  if (deferred) {
    if (kProject ? h == hk * R && cg == 0 : last) store_windows(0, 2 * Dk);
    if (kProject && threadIdx.x == 0 && atomicAdd(counters + hk, 1) == R * groups - 1) counters[hk] = 0, *group_ready = 0;
    return;
  }
  if (!last) return;
  RV_PROBE_MARK(6);
  if (kProject && threadIdx.x == 0) *group_ready = 0;  // every block of the group is past it
  store_windows(0, 2 * Dk);  // nobody reads the old q / k windows any more
  // Gated RMSNorm of the group's rows (R value heads x tokens), a warp per row; a row's loads
  // (Dv <= kMaxDv) are all issued before any is used.
  for (int r = warp; r < R * (t1 - t0); r += kWarps) {
    const int hv = hk * R + r % R, t = t0 + r / R;
    float* o = out + size_t(t) * out_width + hv * Dv;
    const float* z = fused + size_t(t) * sh.width + sh.C + hv * Dv;
    float ov[kMaxDv / 32], zv[kMaxDv / 32];
#pragma unroll
    for (int i = 0; i < kMaxDv / 32; ++i) {
      const int c = min(lane + 32 * i, Dv - 1);
      ov[i] = load_l2(o + c), zv[i] = in(z + c);
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDv / 32; ++i) ss += lane + 32 * i < Dv ? ov[i] * ov[i] : 0.0f;
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / float(Dv) + norm_eps);
#pragma unroll
    for (int i = 0; i < kMaxDv / 32; ++i)
      if (lane + 32 * i < Dv) o[lane + 32 * i] = norm_w[lane + 32 * i] * (ov[i] * inv) * silu(zv[i]);
  }
}

template <int RPT, int CPT, bool kSquares = false>
__global__ void __launch_bounds__(kThreads) gdn_decode_kernel(GDN_DECODE_PARAMS) {
  gdn_decode_block<RPT, CPT, false, kSquares>(x, proj, hidden, fused, conv_w, neg_a, dt_bias, norm_w, norm_eps, conv_states,
                                    states, starts, slots, out, squares, counters, sh);
}

// Two blocks per multiprocessor: 128 blocks (Qwen3-Next) all resident on an 80-SM V100. The bound
// also makes the compiler keep a row pair's 16 weight loads in flight (without it, it spaced them).
template <int RPT>
__global__ void __launch_bounds__(kThreads, 2) gdn_decode_projected_kernel(GDN_DECODE_PARAMS) {
  RV_PROBE_BLOCK(ProbeKind::kGdnDecode);
  gdn_decode_block<RPT, 1, true, false>(x, proj, hidden, fused, conv_w, neg_a, dt_bias, norm_w, norm_eps, conv_states,
                                 states, starts, slots, out, squares, counters, sh);
}
#undef GDN_DECODE_PARAMS

// Launches kKernel (a kProject form) through go when two copies of the block set can be resident
// at once (the group counter's wait needs every block resident; the launch is cooperative, so a
// device shared with other work fails it rather than hangs): the second copy (helpers) takes half
// of each group's projection rows, so twice the warps stream them. One copy alone streamed them
// slower than the projection's own kernel (H200: 440.2 / 439.4 / 432.8 against 447.1 / 445.6 /
// 441.0 tok/s), so without room for two the projection stays a kernel of its own.
template <auto kKernel, typename Go>
bool projected(int64_t blocks, Go& go) {
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kKernel), kThreads, 0);
  if (int64_t(per_sm) * sm_count() < 2 * blocks) return false;
  go(kKernel, true, 2u);
  return true;
}

}  // namespace

void gdn_decode(const Tensor* x, Tensor& fused, const ops::GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares) {
  const int64_t T = fused.size(0), Hv = w.neg_a->numel(), Dv = w.norm->numel(), Dk = states.size(2);
  const int64_t C = w.conv->size(0), W = w.conv->size(1), Hk = (C - Hv * Dv) / (2 * Dk), S = seq_slots.numel();
  RV_CHECK(Hk > 0 && C == 2 * Hk * Dk + Hv * Dv && fused.size(1) >= C + Hv * Dv + 2 * Hv && Hv % Hk == 0,
           "CUDA gdn_decode: fused ", fused.shape_str(), " conv ", w.conv->shape_str(), " states ", states.shape_str());
  if (T == 0 || S == 0) return;
  // State rows split evenly over the warps (a template per count); a block's channels in shared
  // memory; a group counter per (sequence, key head). Past two blocks per multiprocessor of
  // 32-column blocks, 128-column ones (their q / k conv is repeated a quarter as often).
  const int64_t rows = Dk / kWarps;
  // (The deferred norm takes the 32-column form: its squares come a warp's columns at a time.)
  const bool wide = !squares && Hv * ((Dv + 31) / 32) * S > 2 * sm_count() && rows <= 16;
  const int64_t groups = (Dv + (wide ? 127 : 31)) / (wide ? 128 : 32);
  RV_CHECK((rows == 2 || rows == 4 || rows == 8 || rows == 16 || rows == 32) && Dk % kWarps == 0 && W <= kMaxW && Dv <= kMaxDv &&
               w.norm->dtype() == DType::kF32 && 2 * S * Hk <= kArrivalCounters,
           "CUDA gdn_decode: key head dim 16, 32, 64, 128 or 256, value head dim <= ", kMaxDv, ", conv width <= ", kMaxW, ", a float32 norm weight and at most ",
           kArrivalCounters / 2, " (sequence, key head) pairs (got Dk ", Dk, ", Dv ", Dv, ", W ", W, ", ", S, " x ", Hk, ")");
  const Shape sh{int(Hk), int(Dk), int(Hv), int(Dv), int(W), int(fused.size(1)), int(C)};
  const dim3 grid{unsigned(Hv * groups), unsigned(S)};
  // The projection joins the kernel for one token of one sequence with f16 weights of exactly the
  // fused columns; otherwise it is a linear layer of its own.
  const Tensor* p = x ? w.proj : nullptr;
  const bool project = p && T == 1 && S == 1 && !wide && p->dtype() == DType::kF16 && x->dtype() == DType::kF32 &&
                       x->is_contiguous() && p->is_contiguous() && p->dim() == 2 && p->size(0) == C + Hv * Dv + 2 * Hv &&
                       p->size(1) == x->size(1) && p->size(1) % 8 == 0 && reinterpret_cast<uintptr_t>(x->data()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p->data()) % 16 == 0;
  auto go = [&](auto kernel, bool with_projection, unsigned copies = 1) {
    launch_with(true, with_projection, kernel, dim3(grid.x * copies, grid.y), dim3(kThreads), 0,
                with_projection ? x->ptr<float>() : nullptr,
                with_projection ? static_cast<const __half*>(p->data()) : nullptr, with_projection ? int(p->size(1)) : 0,
                fused.ptr<float>(), w.conv->ptr<float>(), w.neg_a->ptr<float>(), w.dt_bias->ptr<float>(),
                w.norm->ptr<float>(), w.norm_eps, conv_states.ptr<float>(), states.ptr<float>(),
                seq_starts.ptr<int32_t>(), seq_slots.ptr<int32_t>(), out.ptr<float>(),
                squares ? squares->ptr<float>() : nullptr, arrival_counters(), sh);
  };
  // The narrow forms per state rows a thread, with the deferred norm compiled in or not (the
  // projected form reads it from squares).
  auto launch_narrow = [&](auto with_squares) {
    constexpr bool kSq = decltype(with_squares)::value;
    switch (rows) {
      case 2: go(gdn_decode_kernel<2, 1, kSq>, false); break;
      case 4: go(gdn_decode_kernel<4, 1, kSq>, false); break;
      case 8: go(gdn_decode_kernel<8, 1, kSq>, false); break;
      case 16: go(gdn_decode_kernel<16, 1, kSq>, false); break;
      default: go(gdn_decode_kernel<32, 1, kSq>, false); break;
    }
  };
  bool launched = false;
  if (project) {
    switch (rows) {
      case 2: launched = projected<gdn_decode_projected_kernel<2>>(grid.x, go); break;
      case 4: launched = projected<gdn_decode_projected_kernel<4>>(grid.x, go); break;
      case 8: launched = projected<gdn_decode_projected_kernel<8>>(grid.x, go); break;
      case 16: launched = projected<gdn_decode_projected_kernel<16>>(grid.x, go); break;
      default: launched = projected<gdn_decode_projected_kernel<32>>(grid.x, go); break;
    }
  }
  if (!launched) {
    if (p) linear(*x, *p, nullptr, fused);
    if (wide) {
      switch (rows) {
        case 2: go(gdn_decode_kernel<2, 4>, false); break;
        case 4: go(gdn_decode_kernel<4, 4>, false); break;
        case 8: go(gdn_decode_kernel<8, 4>, false); break;
        default: go(gdn_decode_kernel<16, 4>, false); break;
      }
    } else if (squares) {
      launch_narrow(std::true_type{});
    } else {
      launch_narrow(std::false_type{});
    }
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
