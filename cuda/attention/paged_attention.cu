// Paged attention for batches that mix prefill chunks and decode tokens (the CPU op's contract),
// over float32, float16, E4M3 or int8 KV caches (kv_elements.cuh: quantized elements turn into
// floats in registers; the layer scales of E4M3 go into q's scale and the output's, int8's row
// scales into each position's score and weight).
//  - Sequences with one query token (decode) use a per-(token, head) kernel: groups of lanes
//    take context positions side by side with an online softmax each, merged in shared memory;
//    when few blocks would leave SMs idle the context is split across blocks and the split that
//    finishes last merges the partial softmaxes (split-K). head_dim <= 256. It reads only device
//    metadata, so it can be captured. In a decode graph of head_dim <= 128 it also runs
//    qkv_rope_attention whole (see Fresh): the step's q, k and v from the fused projection, one
//    kernel where qkv_rope_cache + attention were two.
//  - Sequences with several query tokens (prefill chunks, on top of any cached prefix) use
//    flash-style tiles on tensor cores (prefill_attention.cuh) when head_dim is 64, 128 or 256.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attention/kv_elements.cuh"
#include "attention/prefill_attention.cuh"
#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/arrival.cuh"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
RV_PROBE_TU();
namespace {

// Decode kernel geometry: groups of 8 lanes each take one context position at a time (a lane
// holds D/8 of the head), so a block works on 32 positions (64 with two per group) at once. The
// context is short next to the latency of a dependent walk; many positions in flight is what
// keeps a decode step from waiting on it.
constexpr int kThreads = 256, kGroupLanes = 8, kGroups = kThreads / kGroupLanes, kWarps = kThreads / 32;
constexpr int kMaxD = 256, kMaxSplits = 64, kMergeBatch = 16;

// Bytes of a lane's vector loads: 16, or 8 where a quantized row's lane slice is that short.
template <typename C, int EPL>
constexpr int kChunkBytes = kQuantized<C> && EPL * sizeof(C) == 8 ? 8 : 16;

// The EPL elements of a head row that this lane holds, from element `first` on, as raw floats
// (kv_elements.cuh).
template <int EPL, bool kVec, typename C>
__device__ __forceinline__ void load_slice(const C* __restrict__ p, int first, int D, float (&v)[EPL]) {
  if constexpr (kVec && kChunkBytes<C, EPL> == 8) {
    const uint2 half_chunk = *reinterpret_cast<const uint2*>(p + first);
    float w[16 / sizeof(C)];
    unpack_raw<C>(make_uint4(half_chunk.x, half_chunk.y, 0u, 0u), w);
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = w[i];
  } else if constexpr (kVec) {
    constexpr int kPerVec = 16 / sizeof(C);
#pragma unroll
    for (int i = 0; i < EPL; i += kPerVec) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + first + i);  // one 16-byte load (unpack8's note)
      unpack_raw<C>(raw, v + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < EPL; ++i) v[i] = first + i < D ? to_raw(p[first + i]) : 0.0f;
  }
}

__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kGroupLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ops::OutputGate on the device (g null: no gate).
struct Gate {
  const float* g = nullptr;
  int64_t stride = 0;
  int64_t column = 0;
};

// qkv_rope_attention in one kernel (a decode step, kRope): qkv_rope_cache's inputs. A block takes
// its head's q from this step's row of the fused projection, normed and rotated as qkv_rope_cache
// does; the block whose split holds the step's position (the last) makes its kv head's k and v too
// and uses them for that position as the cache would return them (rounded to its element type),
// so no block reads a slot this kernel writes; the first head of each kv group writes them to the
// slot, and the last split of each head writes its q (the op's q output).
template <typename C>
struct Fresh {
  const float* qkv = nullptr;
  int64_t width = 0;  // of a qkv row
  const float* q_norm = nullptr;  // null: no norm of q (of k: k_norm)
  const float* k_norm = nullptr;
  float eps = 0.0f;
  const int32_t* pos = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int half = 0;  // rotary_dim / 2
  const int32_t* slots = nullptr;
  float* q = nullptr;
  C* k_cache = nullptr;
  C* v_cache = nullptr;
};

// Grid (rows, heads, splits). A split covers at least a round of positions, so for a short
// context the trailing splits have nothing to do: they return at once and nobody waits for them
// (a captured graph sizes the grid for the longest context it may see). Each working split
// writes [max, sum, D unnormalised outputs]; the one that finishes last merges them, saving a
// launch per layer. With one working split the block writes the output itself.
template <typename C, int EPL, bool kVec, int P, bool kRope>
__device__ __forceinline__ void decode_attention(
    const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
    const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
    const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
    const int32_t* __restrict__ token_list, int max_blocks, int block_size, int H, int KVH, int D, float scale,
    float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, Gate gate, KvScales sc,
    const Fresh<C>& fr) {
  // Before the wait: the batch layout (uploaded before the step's first kernel) and the first
  // round's keys and values at the positions that earlier steps wrote, [0, seq_len - q_len); the
  // predecessor (qkv_rope_cache) writes only this step's positions, which are loaded after it.
  const int t = token_list ? token_list[blockIdx.x] : int(blockIdx.x);
  const int h = blockIdx.y, kvh = h / (H / KVH);
  const int group = threadIdx.x / kGroupLanes, first = (threadIdx.x % kGroupLanes) * EPL;
  const int s = seq_of[t];
  const int q_len = query_start[s + 1] - query_start[s], written = seq_lens[s] - q_len;
  const int ctx = written + (t - query_start[s]) + 1;
  const int seg = max(P * kGroups, (ctx + int(gridDim.z) - 1) / int(gridDim.z));
  const int splits = (ctx + seg - 1) / seg, split = blockIdx.z;
  if (split >= splits) return;  // (the working splits wait: this kernel completes after its predecessor)
  const int j0 = split * seg, j1 = min(ctx, j0 + seg);
  // The rounds read positions [j0, jr) from the cache; kRope leaves this step's (written = ctx - 1)
  // to a round of its own after them, from the k and v the block made (a split may lack others).
  const int jr = kRope ? min(j1, written) : j1;
  const int32_t* table = block_tables + size_t(s) * max_blocks;
  using Rows = float[P][EPL];
  using RowScales = float[P];  // int8: each position's K and V row scales
  auto load_position = [&](Rows& kv, Rows& vv, RowScales& ks, RowScales& vs, int p, int jb) {
    // (kRope: a split may have no cached position, and its rounds mask whatever this reads)
    const int last = min(jb + group + p * kGroups, jr - 1), jp = kRope ? max(0, last) : last;
    const size_t slot_row = (size_t(table[jp / block_size]) * block_size + jp % block_size) * KVH + kvh;
    load_slice<EPL, kVec>(kc + slot_row * D, first, D, kv[p]);
    load_slice<EPL, kVec>(vc + slot_row * D, first, D, vv[p]);
    if constexpr (kScaledRows<C>) ks[p] = sc.k_rows[slot_row], vs[p] = sc.v_rows[slot_row];
  };
  auto fresh = [&](int p) { return !kRope && min(j0 + group + p * kGroups, j1 - 1) >= written; };
  float kv0[P][EPL], vv0[P][EPL], ks0[P], vs0[P];  // the first round
#pragma unroll
  for (int p = 0; p < P; ++p)
    if (!fresh(p)) load_position(kv0, vv0, ks0, vs0, p, j0);
  // kRope: column threadIdx.x's norm weights and rope entries (partner: its rotate-half pair).
  float wq = 1.0f, wk = 1.0f, rc = 1.0f, rs = 0.0f;
  int partner = int(threadIdx.x), slot = -1;
  if constexpr (kRope) {
    const int e = int(threadIdx.x);
    slot = fr.slots[t];
    if (e < D) {
      if (fr.q_norm) wq = fr.q_norm[e];
      if (fr.k_norm) wk = fr.k_norm[e];
      if (e < 2 * fr.half) {
        const int64_t at = int64_t(fr.pos[t]) * fr.half + (e < fr.half ? e : e - fr.half);
        rc = fr.cos[at], rs = e < fr.half ? -fr.sin[at] : fr.sin[at];
        partner = e < fr.half ? e + fr.half : e - fr.half;
      }
    }
  }
  wait_for_predecessor();
  RV_PROBE_MARK(1);
  // The output gate of this thread's column (d = threadIdx.x below), loaded with the query.
  const float gv = gate.g && int(threadIdx.x) < D ? gate.g[size_t(t) * gate.stride + gate.column + h * D + threadIdx.x] : 0.0f;
  float qv[EPL], acc[EPL];
  const float* made = nullptr;  // kRope: the k and v rows of this step's position (kMaxD apart)
  if constexpr (kRope) {
    __shared__ float normed[2][kMaxD], rows[3][kMaxD];  // q, k; then rotated q, k and v as the cache holds them
    __shared__ float squares[kWarps][2];
    const int e = int(threadIdx.x);
    const bool in = e < D, fresh_block = j1 == ctx;  // (decode: the step's position is ctx - 1)
    const float* row = fr.qkv + size_t(t) * fr.width;
    float x = in ? load_input(row + size_t(h) * D + e) : 0.0f;
    float y = in && fresh_block ? load_input(row + size_t(H + kvh) * D + e) : 0.0f;
    const float v = in && fresh_block ? load_input(row + size_t(H + KVH + kvh) * D + e) : 0.0f;
    const float sx = warp_sum(x * x), sy = warp_sum(y * y);
    if (e % 32 == 0) squares[e / 32][0] = sx, squares[e / 32][1] = sy;
    __syncthreads();
    float tx = 0.0f, ty = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) tx += squares[w][0], ty += squares[w][1];
    if (fr.q_norm) x = x * rsqrtf(tx / float(D) + fr.eps) * wq;
    if (fr.k_norm) y = y * rsqrtf(ty / float(D) + fr.eps) * wk;
    if (in) normed[0][e] = x, normed[1][e] = y;
    __syncthreads();
    if (in) {
      const float qr = x * rc + normed[0][partner] * rs, kr = y * rc + normed[1][partner] * rs;
      rows[0][e] = qr, rows[1][e] = as_stored<C>(kr), rows[2][e] = as_stored<C>(v);
      if (fresh_block) {
        fr.q[(size_t(t) * H + h) * D + e] = qr;
        if (slot >= 0 && h % (H / KVH) == 0) {
          store(fr.k_cache + (size_t(slot) * KVH + kvh) * D + e, kr);
          store(fr.v_cache + (size_t(slot) * KVH + kvh) * D + e, v);
        }
      }
    }
    __syncthreads();
    made = rows[1];
#pragma unroll
    for (int i = 0; i < EPL; ++i) qv[i] = first + i < D ? rows[0][first + i] * scale : 0.0f, acc[i] = 0.0f;
  } else {
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (fresh(p)) load_position(kv0, vv0, ks0, vs0, p, j0);
    const float* qrow = q + (size_t(t) * H + h) * D;
    const float q_scale = scale * sc.k;
#pragma unroll
    for (int i = 0; i < EPL; ++i) qv[i] = first + i < D ? qrow[first + i] * q_scale : 0.0f, acc[i] = 0.0f;
  }
  RV_PROBE_MARK(2);
  float m = -INFINITY, l = 0.0f;
  // Rounds are the same for every lane (the group sums shuffle across the warp); a group whose
  // position lies past the split's end loads a valid one and drops its score.
  auto round = [&](const Rows& kv, const Rows& vv, const RowScales& ks, const RowScales& vs, int jb, int end) {
    float score[P];
    float m_new = m;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < EPL; ++i) dot += qv[i] * kv[p][i];
      dot = group_sum(dot);
      if constexpr (kScaledRows<C>) dot *= ks[p];
      score[p] = jb + group + p * kGroups < end ? dot : -INFINITY;
      m_new = fmaxf(m_new, score[p]);
    }
    if (m_new == -INFINITY) return;  // no position for this group yet
    const float corr = __expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[i] *= corr;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float w = __expf(score[p] - m_new), wv = kScaledRows<C> ? w * vs[p] : w;
      l += w;
#pragma unroll
      for (int i = 0; i < EPL; ++i) acc[i] += wv * vv[p][i];
    }
    m = m_new;
  };
  // The first round apart, so that the loop keeps its loads at the top of each round (with the
  // first round's loads folded into it, 8K-token runs of this kernel at head_dim 256 measured 16%
  // slower on the H200).
  round(kv0, vv0, ks0, vs0, j0, jr);
  for (int jb = j0 + P * kGroups; jb < jr; jb += P * kGroups) {
    float kv[P][EPL], vv[P][EPL], ks[P], vs[P];
#pragma unroll
    for (int p = 0; p < P; ++p) load_position(kv, vv, ks, vs, p, jb);  // all loads first: they do not depend on the softmax state
    round(kv, vv, ks, vs, jb, jr);
  }
  if constexpr (kRope) {
    if (j1 == ctx) {  // this step's position, taken by group 0 (a round's update, read from shared memory)
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < EPL; ++i) dot += first + i < D ? qv[i] * made[first + i] : 0.0f;
      dot = group_sum(dot);
      if (group == 0) {
        const float m_new = fmaxf(m, dot), corr = __expf(m - m_new), w = __expf(dot - m_new);
        l = l * corr + w;
#pragma unroll
        for (int i = 0; i < EPL; ++i)
          acc[i] = acc[i] * corr + (first + i < D ? w * made[kMaxD + first + i] : 0.0f);
        m = m_new;
      }
    }
  }
  RV_PROBE_MARK(3);
  let_successor_launch();  // the keys and values are read: what is left is short
  // The four groups of a warp, then the warps through shared memory.
#pragma unroll
  for (int o = kGroupLanes; o < 32; o <<= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo = __shfl_xor_sync(0xffffffffu, l, o);
    const float mn = fmaxf(m, mo);
    const float ca = mn == -INFINITY ? 0.0f : __expf(m - mn), cb = mn == -INFINITY ? 0.0f : __expf(mo - mn);
    l = l * ca + lo * cb;
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[i] = acc[i] * ca + __shfl_xor_sync(0xffffffffu, acc[i], o) * cb;
    m = mn;
  }
  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < kGroupLanes) {
    if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if (first + i < D) sacc[warp][first + i] = acc[i];
  }
  __syncthreads();
  const int d = threadIdx.x;
  float gm = -INFINITY;
  for (int w = 0; w < kWarps; ++w) gm = fmaxf(gm, sm[w]);
  float total = 0.0f, res = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (sm[w] == -INFINITY) continue;  // a warp that saw no position
    const float c = __expf(sm[w] - gm);
    total += c * sl[w];
    if (d < D) res += c * sacc[w][d];
  }
  float* dst = out + (size_t(t) * H + h) * D;
  const float g = (gate.g ? sigmoid(gv) : 1.0f) * sc.v;
  if (splits == 1) {
    if (d < D) dst[d] = res / total * g;
    return;
  }
  float* const base = part + (size_t(blockIdx.x) * H + h) * gridDim.z * (D + 2);
  float* mine = base + size_t(split) * (D + 2);
  if (d == 0) mine[0] = gm, mine[1] = total;
  if (d < D) mine[2 + d] = res;
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  int* counter = counters + size_t(blockIdx.x) * H + h;
  RV_PROBE_MARK(4);
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The splits' columns are loaded with their maxima and sums, kMergeBatch at a time (one round
  // trip for a short context's splits), before the weights that scale them are known.
  const float* col = base + 2 + min(d, D - 1);
  float x[kMergeBatch];
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) x[i] = i < splits ? load_l2(col + i * (D + 2)) : 0.0f;
  __shared__ float wsplit[kMaxSplits], lsplit[kMaxSplits];
  if (threadIdx.x < splits) {
    wsplit[threadIdx.x] = load_l2(base + threadIdx.x * (D + 2));
    lsplit[threadIdx.x] = load_l2(base + threadIdx.x * (D + 2) + 1);
  }
  __syncthreads();
  float gmx = -INFINITY;  // every working split saw at least one position: all maxima are finite
  for (int i = 0; i < splits; ++i) gmx = fmaxf(gmx, wsplit[i]);
  __syncthreads();
  if (threadIdx.x < splits) wsplit[threadIdx.x] = __expf(wsplit[threadIdx.x] - gmx);
  __syncthreads();
  float sum = 0.0f;
  for (int i = 0; i < splits; ++i) sum += wsplit[i] * lsplit[i];
  float a = 0.0f;
#pragma unroll
  for (int i = 0; i < kMergeBatch; ++i) a += i < splits ? wsplit[i] * x[i] : 0.0f;
  for (int i0 = kMergeBatch; i0 < splits; i0 += kMergeBatch) {
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) x[i] = i0 + i < splits ? load_l2(col + (i0 + i) * (D + 2)) : 0.0f;
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) a += i0 + i < splits ? wsplit[i0 + i] * x[i] : 0.0f;
  }
  if (d < D) dst[d] = a / sum * g;
  if (threadIdx.x == 0) *counter = 0;  // re-armed for the next call (and graph replay)
}

template <typename C, int EPL, bool kVec, int P>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(
    const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
    const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
    const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
    const int32_t* __restrict__ token_list, int max_blocks, int block_size, int H, int KVH, int D, float scale,
    float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, Gate gate, KvScales sc) {
  RV_PROBE_BLOCK(ProbeKind::kDecodeAttention);
  decode_attention<C, EPL, kVec, P, false>(q, kc, vc, query_start, seq_lens, block_tables, seq_of, token_list,
                                           max_blocks, block_size, H, KVH, D, scale, out, part, counters, gate, sc,
                                           Fresh<C>{});
}

// The fused form, held to two blocks an SM (its forms had taken 126-136 registers otherwise;
// Llama-8B's, 136, fit one block). Only for head_dim <= 128 (kMaxFusedEpl): H200, concurrency 1,
// against qkv_rope_cache + decode attention in the same runs, Llama-8B (head_dim 128) gained 0.8%,
// 0.7%, 0.4% and 0.2% in four runs, while the Qwen3-Next shape (head_dim 256, 16 heads) lost 0.2-0.4%:
// its probe timeline has the q row ready 1.6 us sooner after the QKV projection, yet the kernel
// ends no sooner (a straggler block finishes its rounds ~4 us after the median; not explained).
constexpr int kMaxFusedEpl = 16;
template <typename C, int EPL, bool kVec, int P>
__global__ void __launch_bounds__(kThreads, 2) rope_attention_kernel(
    const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
    const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
    const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
    const int32_t* __restrict__ token_list, int max_blocks, int block_size, int H, int KVH, int D, float scale,
    float* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, Gate gate, KvScales sc, Fresh<C> fr) {
  RV_PROBE_BLOCK(ProbeKind::kDecodeAttention);
  decode_attention<C, EPL, kVec, P, true>(q, kc, vc, query_start, seq_lens, block_tables, seq_of, token_list,
                                          max_blocks, block_size, H, KVH, D, scale, out, part, counters, gate, sc, fr);
}

struct Shape {
  int64_t H, KVH, D;
};

// Splits the context over the blocks of one wave of the chosen kernel when the batch alone leaves
// room: a second wave costs more than the round trip a shorter split saves (H200, Qwen3-Next shape:
// one-round splits of two waves at concurrency 2 and 8 measured 0.7% and 0.6% slower than splits of
// two rounds). A split covers at least a round of positions.
template <typename C, int EPL>
void launch_decode_kernel(const Tensor& q, const C* kc, const C* vc, const ops::AttentionBatch& b, const Shape& sh,
                          const int32_t* qs, const int32_t* lens, const int32_t* tables, const int32_t* seq_of,
                          const int32_t* token_list, int64_t n, int max_ctx, float scale, Tensor& out, const Gate& gate,
                          const KvScales& sc, const Fresh<C>* fresh) {
  constexpr int P = EPL <= 16 ? 2 : 1;  // two positions per group where registers allow
  constexpr bool kCanVec = (EPL * sizeof(C)) % kChunkBytes<C, EPL> == 0;
  auto go = [&](auto kernel, auto... extra) {
    const int64_t work = n * sh.H, round_len = P * kGroups;
    const int64_t resident = int64_t(blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0)) * sm_count();
    int64_t splits = 1;
    if (work < resident && work <= kArrivalCounters)
      splits = std::clamp<int64_t>(resident / work, 1, std::min<int64_t>(kMaxSplits, (max_ctx + round_len - 1) / round_len));
    Tensor part;
    if (splits > 1) part = Tensor::uninitialized({n, sh.H, splits, sh.D + 2}, DType::kF32, Device::kCUDA);
    launch_dependent(kernel, dim3(unsigned(n), unsigned(sh.H), unsigned(splits)), dim3(kThreads), 0, q.ptr<float>(), kc,
                     vc, qs, lens, tables, seq_of, token_list, b.max_blocks_per_seq, b.block_size, int(sh.H), int(sh.KVH),
                     int(sh.D), scale, out.ptr<float>(), splits > 1 ? part.ptr<float>() : nullptr,
                     splits > 1 ? arrival_counters() : nullptr, gate, sc, extra...);
  };
  const bool vec = kCanVec && sh.D == kGroupLanes * EPL;
  if constexpr (EPL <= kMaxFusedEpl && !kQuantized<C>) {
    if (fresh && vec) return go(rope_attention_kernel<C, EPL, kCanVec, P>, *fresh);
    if (fresh) return go(rope_attention_kernel<C, EPL, false, P>, *fresh);
  }
  if (vec) go(decode_attention_kernel<C, EPL, kCanVec, P>);
  else go(decode_attention_kernel<C, EPL, false, P>);
  RV_CUDA_CHECK(cudaGetLastError());
}

// Decode tokens: token_list (device, n rows) or, when null, every row 0..n-1; with `fresh`, the
// one-kernel qkv_rope_attention.
template <typename C>
void launch_decode(const Tensor& q, const C* kc, const C* vc, const ops::AttentionBatch& b, const Shape& sh,
                   const int32_t* qs, const int32_t* lens, const int32_t* tables, const int32_t* seq_of,
                   const int32_t* token_list, int64_t n, int max_ctx, float scale, Tensor& out, const Gate& gate,
                   const KvScales& sc, const Fresh<C>* fresh = nullptr) {
  if (n == 0) return;
  auto with = [&](auto epl) {
    launch_decode_kernel<C, decltype(epl)::value>(q, kc, vc, b, sh, qs, lens, tables, seq_of, token_list, n, max_ctx,
                                                  scale, out, gate, sc, fresh);
  };
  if (sh.D <= 32) with(std::integral_constant<int, 4>{});
  else if (sh.D <= 64) with(std::integral_constant<int, 8>{});
  else if (sh.D <= 128) with(std::integral_constant<int, 16>{});
  else with(std::integral_constant<int, 32>{});
}

template <typename C>
void run(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b, float scale,
         Tensor& out, const ops::OutputGate* og, const ops::KvQuant* quant) {
  const Gate gate = og ? Gate{og->gate->ptr<float>(), og->gate->size(1), og->column} : Gate{};
  const KvScales sc = kv_scales<C>(quant);
  const Shape sh{q.size(1), k_cache.size(2), q.size(2)};
  const int64_t T = q.size(0);
  const C* kc = k_cache.ptr<C>();
  const C* vc = v_cache.ptr<C>();
  if (b.decode_only && b.dev_query_start) {  // the captured-graph path: device metadata only
    launch_decode(q, kc, vc, b, sh, b.dev_query_start, b.dev_seq_lens, b.dev_block_tables, b.dev_token_seq, nullptr, T,
                  b.max_seq_len, scale, out, gate, sc);
    return;
  }
  // Plan on the host: decode rows for the per-token kernel, 64-row tiles of the multi-token
  // sequences for the tensor-core kernel. Metadata the runner did not upload goes up here, in
  // one copy (asynchronous from pageable memory: the source may be reused at once).
  const int32_t S = b.num_seqs;
  const bool tiles_ok = prefill_supported(int(sh.D));
  std::vector<int32_t> decode_rows, tiles;  // tiles: (seq, first query row within the seq)
  int max_ctx = 0;
  for (int32_t s = 0; s < S; ++s) {
    const int32_t q0 = b.query_start[s], q1 = b.query_start[s + 1];
    max_ctx = std::max(max_ctx, b.seq_lens[s]);
    if (q1 - q0 > 1 && tiles_ok) {
      for (int32_t r = 0; r < q1 - q0; r += prefill_rows(int(sh.D))) tiles.push_back(s), tiles.push_back(r);
    } else {
      for (int32_t t = q0; t < q1; ++t) decode_rows.push_back(t);
    }
  }
  const size_t n_meta = b.dev_query_start ? 0 : size_t(S) + 1 + size_t(S) + size_t(S) * b.max_blocks_per_seq + size_t(T);
  std::vector<int32_t> host(n_meta + decode_rows.size() + tiles.size());
  size_t off = 0;
  auto put = [&](const int32_t* p, size_t n) {
    std::copy(p, p + n, host.begin() + off);
    off += n;
  };
  if (n_meta) {
    put(b.query_start, size_t(S) + 1);
    put(b.seq_lens, size_t(S));
    put(b.block_tables, size_t(S) * b.max_blocks_per_seq);
    for (int32_t s = 0; s < S; ++s)
      for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) host[off++] = s;
  }
  put(decode_rows.data(), decode_rows.size());
  put(tiles.data(), tiles.size());
  Tensor dev = Tensor::uninitialized({int64_t(std::max<size_t>(1, host.size()))}, DType::kI32, Device::kCUDA);
  RV_CUDA_CHECK(cudaMemcpyAsync(dev.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream()));
  const int32_t* d = dev.ptr<int32_t>();
  const int32_t* qs = n_meta ? d : b.dev_query_start;
  const int32_t* lens = n_meta ? d + S + 1 : b.dev_seq_lens;
  const int32_t* tables = n_meta ? d + 2 * S + 1 : b.dev_block_tables;
  const int32_t* seq_of = n_meta ? d + 2 * S + 1 + size_t(S) * b.max_blocks_per_seq : b.dev_token_seq;
  const bool all_rows = decode_rows.size() == size_t(T);
  // With prefill tiles the gate is applied to every row afterwards (the tiles do not take it).
  launch_decode(q, kc, vc, b, sh, qs, lens, tables, seq_of, all_rows ? nullptr : d + n_meta, int64_t(decode_rows.size()),
                max_ctx, scale, out, tiles.empty() ? gate : Gate{}, sc);
  if (tiles.empty()) return;
  launch_prefill(q.ptr<float>(), kc, vc, sc, qs, lens, tables, d + n_meta + decode_rows.size(), int(tiles.size() / 2),
                 b.max_blocks_per_seq, b.block_size, int(sh.H), int(sh.KVH), int(sh.D), scale, out.ptr<float>());
  if (og) {
    Tensor flat = out.view({T, sh.H * sh.D});
    sigmoid_mul(flat, *og->gate, og->column);
  }
}

// The decode graph's batch (device metadata only, one token per sequence) in one kernel.
template <typename C>
void run_fused(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
               const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const ops::AttentionBatch& b,
               float scale, Tensor& out, const ops::OutputGate* og) {
  const Gate gate = og ? Gate{og->gate->ptr<float>(), og->gate->size(1), og->column} : Gate{};
  const Shape sh{q.size(1), k_cache.size(2), q.size(2)};
  Fresh<C> fr;
  fr.qkv = qkv.ptr<float>();
  fr.width = qkv.size(1);
  fr.q_norm = norm.q ? norm.q->ptr<float>() : nullptr;
  fr.k_norm = norm.k ? norm.k->ptr<float>() : nullptr;
  fr.eps = norm.eps;
  fr.pos = positions.ptr<int32_t>();
  fr.cos = rope.cos.ptr<float>();
  fr.sin = rope.sin.ptr<float>();
  fr.half = rope.rotary_dim / 2;
  fr.slots = slot_mapping.ptr<int32_t>();
  fr.q = q.ptr<float>();
  fr.k_cache = k_cache.ptr<C>();
  fr.v_cache = v_cache.ptr<C>();
  launch_decode(q, k_cache.ptr<C>(), v_cache.ptr<C>(), b, sh, b.dev_query_start, b.dev_seq_lens, b.dev_block_tables,
                b.dev_token_seq, nullptr, q.size(0), b.max_seq_len, scale, out, gate, KvScales{}, &fr);
}

}  // namespace

void qkv_rope_attention(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const ops::AttentionBatch& b, float scale, Tensor& out, const ops::OutputGate* gate,
                        const ops::KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  // One kernel per token writes its own K/V and attends: only with one token per sequence (a
  // verify step's tokens read each other's K/V, which must all be written first). Quantized caches
  // take the two kernels.
  const bool one_kernel = b.decode_only && b.tokens_per_seq == 1 && b.dev_query_start && T > 0 && D <= kGroupLanes * kMaxFusedEpl &&
                          H % KVH == 0 && qkv.dtype() == DType::kF32 && qkv.size(0) == T &&
                          qkv.size(1) >= (H + 2 * KVH) * D && 2 * (rope.rotary_dim / 2) <= D && !rope.axes.defined();
  if (one_kernel && k_cache.dtype() == DType::kF32) {
    run_fused<float>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, b, scale, out, gate);
  } else if (one_kernel && k_cache.dtype() == DType::kF16) {
    run_fused<__half>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, b, scale, out, gate);
  } else {
    revolta::cuda::qkv_rope_cache(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant);
    revolta::cuda::paged_attention(q, k_cache, v_cache, b, scale, out, gate, quant);
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b,
                     float scale, Tensor& out, const ops::OutputGate* gate, const ops::KvQuant* quant) {
  const int64_t D = q.size(2);
  RV_CHECK(D <= kMaxD && q.size(1) % k_cache.size(2) == 0, "CUDA paged_attention: head_dim ", D,
           " (<= 256) / heads ", q.size(1), "/", k_cache.size(2));
  if (q.size(0) == 0) return;
  switch (k_cache.dtype()) {
    case DType::kF32: return run<float>(q, k_cache, v_cache, b, scale, out, gate, quant);
    case DType::kF16: return run<__half>(q, k_cache, v_cache, b, scale, out, gate, quant);
    case DType::kF8E4M3: return run<Fp8>(q, k_cache, v_cache, b, scale, out, gate, quant);
    case DType::kI8: return run<int8_t>(q, k_cache, v_cache, b, scale, out, gate, quant);
    default: throw std::invalid_argument("CUDA paged_attention: no kernel for a " + std::string(dtype_name(k_cache.dtype())) + " cache");
  }
}

}  // namespace revolta::cuda
