// Paged attention for batches that mix prefill chunks and decode tokens (the CPU op's contract),
// over float32 or float16 KV caches.
//  - Sequences with one query token (decode) use a per-(token, head) kernel: its warps stride
//    over the context with an online softmax each, merged in shared memory; when few blocks would
//    leave SMs idle the context is split across blocks and a second kernel merges the partial
//    softmaxes (split-K). head_dim <= 256. It reads only device metadata, so it can be captured.
//  - Sequences with several query tokens (prefill chunks, on top of any cached prefix) use
//    flash-style tiles on tensor cores (prefill_attention.cuh) when head_dim is 64 or 128.
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "attention/prefill_attention.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4, kMaxPerLane = 8;

// A load that skips L1: other blocks' partial results are read right after they were written.
__device__ __forceinline__ float load_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

template <typename C>
__global__ void decode_attention_kernel(const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc,
                                        const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
                                        const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
                                        const int32_t* __restrict__ token_list, int max_blocks, int block_size, int H,
                                        int KVH, int D, float scale, float* __restrict__ out, float* __restrict__ part,
                                        int* __restrict__ counters) {
  const int t = token_list ? token_list[blockIdx.x] : int(blockIdx.x);
  const int h = blockIdx.y, kvh = h / (H / KVH), split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = seq_of[t];
  const int q_len = query_start[s + 1] - query_start[s];
  const int ctx = seq_lens[s] - q_len + (t - query_start[s]) + 1;
  const int32_t* table = block_tables + size_t(s) * max_blocks;
  const int per_lane = (D + 31) / 32;
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    qv[i] = (i < per_lane && d < D) ? q[(size_t(t) * H + h) * D + d] * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const size_t row = size_t(KVH) * D;
  const int seg = (ctx + splits - 1) / splits, j0 = split * seg, j1 = min(ctx, j0 + seg);
  for (int j = j0 + warp; j < j1; j += kWarps) {
    const size_t base = (size_t(table[j / block_size]) * block_size + j % block_size) * row + size_t(kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (i < per_lane && d < D) dot += qv[i] * to_float(kc[base + d]);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (i < per_lane) acc[i] = acc[i] * corr + (d < D ? p * to_float(vc[base + d]) : 0.0f);
    }
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w]);
  float total = 0.0f;
  float res[kMaxPerLane] = {};
  for (int w = 0; w < kWarps; ++w) {
    if (sm[w] == -INFINITY) continue;  // a warp that saw no position
    const float c = __expf(sm[w] - mx);
    total += c * sl[w];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) res[i] += c * sacc[w][lane + 32 * i];
  }
  if (splits == 1) {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (i < per_lane && d < D) out[(size_t(t) * H + h) * D + d] = res[i] / total;
    }
  } else {  // partial result of this split: [max, sum, D unnormalised outputs]
    float* p = part + ((size_t(blockIdx.x) * H + h) * splits + split) * (D + 2);
    if (lane == 0) p[0] = mx, p[1] = total;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (i < per_lane && d < D) p[2 + d] = res[i];
    }
    if (!counters) return;  // a separate merge kernel follows
    // The split that finishes last merges them all (and re-arms the counter for the next step),
    // saving a launch per layer in a decode step.
    __threadfence();
    __syncwarp();
    int prev = 0;
    if (lane == 0) prev = atomicAdd(counters + size_t(blockIdx.x) * H + h, 1);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != splits - 1) return;
    __threadfence();
    const float* base = part + (size_t(blockIdx.x) * H + h) * splits * (D + 2);
    float gmx = -INFINITY;
    for (int s2 = 0; s2 < splits; ++s2) gmx = fmaxf(gmx, load_l2(base + s2 * (D + 2)));
    for (int d = lane; d < D; d += 32) {
      float sum = 0.0f, acc2 = 0.0f;
      for (int s2 = 0; s2 < splits; ++s2) {
        const float ms = load_l2(base + s2 * (D + 2));
        if (ms == -INFINITY) continue;  // an empty split
        const float c = __expf(ms - gmx);
        sum += c * load_l2(base + s2 * (D + 2) + 1);
        acc2 += c * load_l2(base + s2 * (D + 2) + 2 + d);
      }
      out[(size_t(t) * H + h) * D + d] = acc2 / sum;
    }
    if (lane == 0) counters[size_t(blockIdx.x) * H + h] = 0;
  }
}

__global__ void merge_splits_kernel(const float* __restrict__ part, const int32_t* __restrict__ token_list, int splits,
                                    int H, int D, float* __restrict__ out) {
  const int t = token_list ? token_list[blockIdx.x] : int(blockIdx.x), h = blockIdx.y;
  const float* p = part + (size_t(blockIdx.x) * H + h) * splits * (D + 2);
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, p[s * (D + 2)]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float total = 0.0f, acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = p[s * (D + 2)];
      if (ms == -INFINITY) continue;  // an empty split
      const float c = __expf(ms - mx);
      total += c * p[s * (D + 2) + 1];
      acc += c * p[s * (D + 2) + 2 + d];
    }
    out[(size_t(t) * H + h) * D + d] = acc / total;
  }
}

// Arrival counters for the split merge: zeroed once, re-armed by the merging block, so captured
// graphs can use them on every replay. Allocated outside the memory pools (a graph's private pool
// would take them away with it); the first call always comes before any recording (the sizing
// run of a capture), so no allocation happens during one. Null when more are needed than exist:
// the caller then merges with a separate kernel.
int* merge_counters(int64_t n) {
  constexpr int64_t kCapacity = int64_t(1) << 16;
  static int* buf = [] {
    int* p = nullptr;
    RV_CUDA_CHECK(cudaMalloc(&p, kCapacity * sizeof(int)));
    RV_CUDA_CHECK(cudaMemset(p, 0, kCapacity * sizeof(int)));
    return p;
  }();
  return n <= kCapacity ? buf : nullptr;
}

struct Shape {
  int64_t H, KVH, D;
};

// Decode tokens: token_list (device, n rows) or, when null, every row 0..n-1.
template <typename C>
void launch_decode(const Tensor& q, const C* kc, const C* vc, const ops::AttentionBatch& b, const Shape& sh,
                   const int32_t* qs, const int32_t* lens, const int32_t* tables, const int32_t* seq_of,
                   const int32_t* token_list, int64_t n, int max_ctx, float scale, Tensor& out) {
  if (n == 0) return;
  // Split the context so that about 8 blocks per SM are in flight (each block's warps walk their
  // positions one after another: latency, not bandwidth, bounds a long walk), down to 64
  // positions per split.
  const int64_t work = n * sh.H, sms = sm_count();
  int splits = 1;
  if (work < 8 * sms) splits = int(std::max<int64_t>(1, std::min<int64_t>((8 * sms + work - 1) / work, max_ctx / 64)));
  Tensor part;
  if (splits > 1) part = Tensor::uninitialized({n, sh.H, splits, sh.D + 2}, DType::kF32, Device::kCUDA);
  int* counters = splits > 1 ? merge_counters(n * sh.H) : nullptr;
  decode_attention_kernel<C><<<dim3(unsigned(n), unsigned(sh.H), unsigned(splits)), 32 * kWarps, 0, stream()>>>(
      q.ptr<float>(), kc, vc, qs, lens, tables, seq_of, token_list, b.max_blocks_per_seq, b.block_size, int(sh.H),
      int(sh.KVH), int(sh.D), scale, out.ptr<float>(), splits > 1 ? part.ptr<float>() : nullptr, counters);
  RV_CUDA_CHECK(cudaGetLastError());
  if (splits > 1 && !counters) {
    merge_splits_kernel<<<dim3(unsigned(n), unsigned(sh.H)), 128, 0, stream()>>>(part.ptr<float>(), token_list, splits,
                                                                                   int(sh.H), int(sh.D), out.ptr<float>());
    RV_CUDA_CHECK(cudaGetLastError());
  }
}

template <typename C>
void run(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b, float scale,
         Tensor& out) {
  const Shape sh{q.size(1), k_cache.size(2), q.size(2)};
  const int64_t T = q.size(0);
  const C* kc = k_cache.ptr<C>();
  const C* vc = v_cache.ptr<C>();
  if (b.decode_only && b.dev_query_start) {  // the captured-graph path: device metadata only
    launch_decode(q, kc, vc, b, sh, b.dev_query_start, b.dev_seq_lens, b.dev_block_tables, b.dev_token_seq, nullptr, T,
                  b.max_seq_len, scale, out);
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
      for (int32_t r = 0; r < q1 - q0; r += kPrefillRows) tiles.push_back(s), tiles.push_back(r);
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
  launch_decode(q, kc, vc, b, sh, qs, lens, tables, seq_of, all_rows ? nullptr : d + n_meta, int64_t(decode_rows.size()),
                max_ctx, scale, out);
  if (!tiles.empty())
    launch_prefill(q.ptr<float>(), kc, vc, qs, lens, tables, d + n_meta + decode_rows.size(), int(tiles.size() / 2),
                   b.max_blocks_per_seq, b.block_size, int(sh.H), int(sh.KVH), int(sh.D), scale, out.ptr<float>());
}

}  // namespace

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b,
                     float scale, Tensor& out) {
  const int64_t D = q.size(2);
  RV_CHECK(D <= 32 * kMaxPerLane && q.size(1) % k_cache.size(2) == 0, "CUDA paged_attention: head_dim ", D,
           " (<= 256) / heads ", q.size(1), "/", k_cache.size(2));
  if (q.size(0) == 0) return;
  if (k_cache.dtype() == DType::kF32) run<float>(q, k_cache, v_cache, b, scale, out);
  else if (k_cache.dtype() == DType::kF16) run<__half>(q, k_cache, v_cache, b, scale, out);
  else throw std::invalid_argument("CUDA paged_attention: the KV cache must be float32 or float16");
}

}  // namespace revolta::cuda
