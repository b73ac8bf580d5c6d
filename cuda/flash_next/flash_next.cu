// Flash-Next's ops on the GPU: hyper-connection mix and combine, n-gram PLE hashing and gating,
// QSA's block choice and its sparse attention (contracts in ops/ops.h). fp32 arithmetic; the
// attention reads every KV element type. First forms, written for clarity: one block per row or
// per (token, head), no tensor cores.
#include <cuda_fp16.h>

#include <algorithm>
#include <vector>

#include "attention/kv_elements.cuh"
#include "core/block_sum.cuh"
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + __expf(-x)); }

unsigned blocks_for(int64_t n) { return unsigned(std::max<int64_t>(1, (n + kThreads - 1) / kThreads)); }

__global__ void group_rms_norm_kernel(const float* x, const float* w, float* out, int group, int width, float eps) {
  const int64_t t = blockIdx.x, g0 = int64_t(blockIdx.y) * group;
  const float* row = x + t * width + g0;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < group; i += blockDim.x) ss += row[i] * row[i];
  __shared__ float sums[32];
  __shared__ float total;
  const float inv = rsqrtf(block_sum(ss, sums, total) / float(group) + eps);
  for (int i = threadIdx.x; i < group; i += blockDim.x) out[t * width + g0 + i] = row[i] * inv * w[g0 + i];
}

__global__ void scaled_silu_kernel(const float* x, int64_t width, int64_t columns, float scale, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = scale * x[(i / columns) * width + i % columns];
  out[i] = v * sigmoidf(v);
}

__global__ void hc_mix_kernel(const float* normed, const float* logits, float* out, int64_t E, int hc, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / E, e = i % E;
  float acc = 0.0f;
  for (int c = 0; c < hc; ++c) acc += sigmoidf(logits[(t * hc + c) * E + e]) * normed[(t * hc + c) * E + e];
  out[i] = acc / float(hc);
}

__global__ void hc_combine_kernel(float* streams, const float* y, const float* logits, int64_t L, int64_t column,
                                  float scale, int64_t E, int hc, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / (hc * E), c = (i / E) % hc;
  streams[i] += 2.0f * sigmoidf(scale * logits[t * L + column + c]) * y[t * E + i % E];
}

__global__ void accumulate_kernel(float* out, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] += x[i];
}

// One thread per sequence: its tokens in order, then its window advanced (as the CPU's).
__global__ void ngram_rows_kernel(const int32_t* ids, const uint64_t* mult, const int64_t* sizes, const int64_t* offsets,
                                  int N, int per_ngram, int eos, float* windows, const int32_t* starts,
                                  const int32_t* slots, int S, int32_t* rows) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int back = N - 1, heads = back * per_ngram;
  if (slots[s] < 0) {  // a padding row: row 0, whatever its token
    for (int64_t i = int64_t(starts[s]) * heads; i < int64_t(starts[s + 1]) * heads; ++i) rows[i] = 0;
    return;
  }
  float* win = windows + int64_t(slots[s]) * back;
  const int t0 = starts[s], t1 = starts[s + 1];
  for (int t = t0; t < t1; ++t) {
    int64_t ctx[8];  // ngram_size <= 8
    ctx[0] = ids[t];
    bool cut = false;
    for (int j = 1; j < N; ++j) {
      const int64_t prev = t - j >= t0 ? ids[t - j] : int64_t(win[j - (t - t0) - 1]) - 1;
      cut = cut || prev < 0 || prev == eos;
      ctx[j] = cut ? eos : prev;
    }
    for (int n = 2; n <= N; ++n) {
      uint64_t m = 0;
      for (int j = 0; j < n; ++j) m ^= uint64_t(ctx[j]) * mult[j];
      for (int i = 0; i < per_ngram; ++i) {
        const int h = (n - 2) * per_ngram + i;
        rows[int64_t(t) * heads + h] = int32_t(int64_t(m % uint64_t(sizes[h])) + offsets[h]);
      }
    }
  }
  const int count = t1 - t0;
  float next[8];
  for (int j = 0; j < back; ++j) next[j] = j < count ? float(ids[t1 - 1 - j] + 1) : win[j - count];
  for (int j = 0; j < back; ++j) win[j] = next[j];
}

__global__ void ple_gate_kernel(const float* key, const float* query, const float* value, float* out, int E, int hc) {
  const int64_t row = blockIdx.x, t = row / hc;  // one (token, stream) a block
  float d = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) d += key[row * E + i] * query[row * E + i];
  __shared__ float sums[32];
  __shared__ float total;
  const float s = block_sum(d, sums, total) * rsqrtf(float(E));
  const float g = sigmoidf(copysignf(sqrtf(fmaxf(fabsf(s), 1e-6f)), s) * (s != 0.0f ? 1.0f : 0.0f));
  for (int i = threadIdx.x; i < E; i += blockDim.x) out[row * E + i] = g * value[t * E + i];
}

__global__ void token_rows_write_kernel(const float* x, const int32_t* slot, float* cache, int W, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / W;
  if (slot[t] >= 0) cache[int64_t(slot[t]) * W + i % W] = x[i];
}

// The batch layout QSA's kernels read: per sequence its first query row, length and first pooled
// key, then its block table; per token its sequence. Uploaded once per call, or (a captured graph)
// the runner's device mirrors, with each sequence's keys at a fixed stride (key_at null).
struct QsaMeta {
  const int32_t *qs, *lens, *key_at, *tables, *seq_of;
  int max_blocks, block_size, key_stride;
};

__device__ __forceinline__ int64_t first_key(const QsaMeta& m, int s) {
  return m.key_at ? int64_t(m.key_at[s]) : int64_t(s) * m.key_stride;
}

// Blocks (x, s) take the complete blocks x, x + gridDim.x, ... of sequence s: the mean of its raw
// key rows, normalised, rotated to the block start. blockDim: D rounded up to whole warps.
__global__ void qsa_keys_kernel(const float* rows, QsaMeta m, const float* k_norm, const float* cos, const float* sin,
                                int half, int D, int ratio, float eps, float* keys) {
  const int s = blockIdx.y;
  const int nb = m.lens[s] / ratio;
  extern __shared__ float key[];
  __shared__ float sums[32];
  __shared__ float total;
  const int d = threadIdx.x;
  for (int blk = blockIdx.x; blk < nb; blk += gridDim.x) {
    float v = 0.0f;
    if (d < D) {
      for (int j = blk * ratio; j < (blk + 1) * ratio; ++j) {
        const int64_t slot = int64_t(m.tables[int64_t(s) * m.max_blocks + j / m.block_size]) * m.block_size + j % m.block_size;
        v += rows[slot * D + d];
      }
      v /= float(ratio);
    }
    const float inv = rsqrtf(block_sum(v * v, sums, total) / float(D) + eps);
    if (d < D) key[d] = v * inv * k_norm[d];
    __syncthreads();
    if (d < D) {
      const int64_t p = int64_t(blk) * ratio;
      float out = key[d];
      if (d < half) out = key[d] * cos[p * half + d] - key[d + half] * sin[p * half + d];
      else if (d < 2 * half) out = key[d] * cos[p * half + d - half] + key[d - half] * sin[p * half + d - half];
      keys[(first_key(m, s) + blk) * D + d] = out;
    }
    __syncthreads();  // key[] and the sums are rewritten by the next block
  }
}

__device__ __forceinline__ uint32_t ordered(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum over the block (kThreads threads); total: the sum.
__device__ int block_scan(int v, int* warp_sums, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kThreads / 32 ? warp_sums[lane] : 0, wi = w;
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += n;
    }
    if (lane < kThreads / 32) warp_sums[lane] = wi - w;
    if (lane == 31) warp_sums[32] = wi;
  }
  __syncthreads();
  const int out = warp_sums[warp] + inc - v;
  total = warp_sums[32];
  __syncthreads();
  return out;
}

// One block per query token: scores of its complete blocks, then the top ones by a radix select of
// the k-th largest score (ties to the lower block), written in ascending block order.
__global__ void __launch_bounds__(kThreads) qsa_select_kernel(const float* q, const float* keys, QsaMeta m, int heads,
                                                              int D, int ratio, int top, float* scores, int score_stride,
                                                              int32_t* blocks) {
  const int t = blockIdx.x, s = m.seq_of[t];
  const int pos = m.lens[s] - (m.qs[s + 1] - m.qs[s]) + (t - m.qs[s]);
  const int visible = (pos + 1) / ratio, k = min(top, visible);
  float* sc = scores + int64_t(t) * score_stride;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int blk = warp; blk < visible; blk += kThreads / 32) {
    const float* key = keys + (first_key(m, s) + blk) * D;
    float total = 0.0f;
    for (int h = 0; h < heads; ++h) {
      float d = 0.0f;
      for (int i = lane; i < D; i += 32) d += q[(int64_t(t) * heads + h) * D + i] * key[i];
      total += fmaxf(0.0f, warp_sum(d));
    }
    if (lane == 0) sc[blk] = total;
  }
  __syncthreads();
  __shared__ int hist[256];
  __shared__ uint32_t prefix_s;
  __shared__ int remaining_s;
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0 && k > 0; shift -= 8) {
    hist[threadIdx.x] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < visible; i += kThreads) {
      const uint32_t u = ordered(sc[i]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, digit = 0;
      for (digit = 255; digit > 0 && cum + hist[digit] < remaining; --digit) cum += hist[digit];
      prefix_s = prefix | (uint32_t(digit) << shift);
      remaining_s = remaining - cum;
    }
    __syncthreads();
    prefix = prefix_s, remaining = remaining_s, mask |= 255u << shift;
    __syncthreads();
  }
  // prefix: the k-th largest score; remaining: how many equal to it are kept (the lowest blocks).
  __shared__ int warp_sums[33];
  int taken = 0, equal_seen = 0;
  for (int base = 0; base < visible && k > 0; base += kThreads) {
    const int i = base + threadIdx.x;
    const uint32_t u = i < visible ? ordered(sc[i]) : 0u;
    const bool greater = i < visible && u > prefix, equal = i < visible && u == prefix;
    int equal_total = 0, keep_total = 0;
    const int equal_before = block_scan(equal ? 1 : 0, warp_sums, equal_total);
    const bool keep = greater || (equal && equal_seen + equal_before < remaining);
    const int at = block_scan(keep ? 1 : 0, warp_sums, keep_total);
    if (keep) blocks[int64_t(t) * top + taken + at] = i;
    taken += keep_total, equal_seen += equal_total;
  }
  for (int i = k + threadIdx.x; i < top; i += kThreads) blocks[int64_t(t) * top + i] = -1;
}

// One block per (token, query head): softmax over the kept cells (chosen blocks, then the tail).
template <typename C>
__global__ void qsa_attention_kernel(const float* q, const C* kc, const C* vc, KvScales sc, QsaMeta m, const int32_t* blocks,
                                     int top, int ratio, int H, int KVH, int D, float scale, float* probs, int prob_stride,
                                     float* out, const float* gate, int64_t gate_width, int64_t gate_column) {
  const int t = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH), s = m.seq_of[t];
  const int pos = m.lens[s] - (m.qs[s + 1] - m.qs[s]) + (t - m.qs[s]);
  int k = 0;
  while (k < top && blocks[int64_t(t) * top + k] >= 0) ++k;
  const int tail0 = (pos + 1) / ratio * ratio, n = k * ratio + (pos + 1 - tail0);
  auto cell = [&](int j) {
    const int c = j < k * ratio ? blocks[int64_t(t) * top + j / ratio] * ratio + j % ratio : tail0 + (j - k * ratio);
    return int64_t(m.tables[int64_t(s) * m.max_blocks + c / m.block_size]) * m.block_size + c % m.block_size;
  };
  const float* qr = q + (int64_t(t) * H + h) * D;
  float* p = probs + (int64_t(t) * H + h) * prob_stride;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int64_t slot = cell(j);
    const C* kr = kc + (slot * KVH + kvh) * D;
    float d = 0.0f;
    for (int i = 0; i < D; ++i) d += qr[i] * to_raw(kr[i]);
    const float ks = sc.k_rows ? sc.k_rows[slot * KVH + kvh] : sc.k;
    p[j] = d * ks * scale;
    mx = fmaxf(mx, p[j]);
  }
  __shared__ float red[32];
  __shared__ float total;
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    float v = -INFINITY;
    for (int w = 0; w < int(blockDim.x) / 32; ++w) v = fmaxf(v, red[w]);
    total = v;
  }
  __syncthreads();
  mx = total;
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += p[j] = __expf(p[j] - mx);
  const float inv = 1.0f / block_sum(sum, red, total);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const int64_t slot = cell(j);
      const float vs = sc.v_rows ? sc.v_rows[slot * KVH + kvh] : sc.v;
      acc += p[j] * to_raw(vc[(slot * KVH + kvh) * D + d]) * vs;
    }
    acc *= inv;
    if (gate) acc *= sigmoidf(gate[int64_t(t) * gate_width + gate_column + int64_t(h) * D + d]);
    out[(int64_t(t) * H + h) * D + d] = acc;
  }
}

// The batch layout on the device (see QsaMeta) and each sequence's first pooled key.
struct QsaLayout {
  Tensor dev;
  QsaMeta meta{};
  int total_keys = 0, max_keys = 0;
};

QsaLayout qsa_layout(const ops::AttentionBatch& b, int64_t T, int ratio) {
  const int S = b.num_seqs;
  if (b.decode_only && b.dev_query_start) {  // a captured graph's: nothing planned from host arrays
    QsaLayout l;
    l.max_keys = b.max_seq_len / ratio;
    l.total_keys = S * l.max_keys;
    l.meta = {b.dev_query_start, b.dev_seq_lens, nullptr, b.dev_block_tables, b.dev_token_seq, b.max_blocks_per_seq,
              b.block_size, l.max_keys};
    return l;
  }
  std::vector<int32_t> host;
  host.insert(host.end(), b.query_start, b.query_start + S + 1);
  host.insert(host.end(), b.seq_lens, b.seq_lens + S);
  QsaLayout l;
  for (int s = 0; s < S; ++s) {
    host.push_back(l.total_keys);
    l.total_keys += b.seq_lens[s] / ratio;
    l.max_keys = std::max(l.max_keys, b.seq_lens[s] / ratio);
  }
  host.insert(host.end(), b.block_tables, b.block_tables + int64_t(S) * b.max_blocks_per_seq);
  for (int s = 0; s < S; ++s)
    for (int t = b.query_start[s]; t < b.query_start[s + 1]; ++t) host.push_back(s);
  RV_CHECK(int64_t(b.query_start[S]) == T, "qsa: the batch's query rows (", b.query_start[S], ") are not the ", T, " tokens");
  l.dev = Tensor::uninitialized({int64_t(host.size())}, DType::kI32, Device::kCUDA);
  RV_CUDA_CHECK(cudaMemcpyAsync(l.dev.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream()));
  const int32_t* d = l.dev.ptr<int32_t>();
  l.meta = {d, d + S + 1, d + 2 * S + 1, d + 3 * S + 1, d + 3 * S + 1 + int64_t(S) * b.max_blocks_per_seq,
            b.max_blocks_per_seq, b.block_size, 0};
  return l;
}

template <typename C>
void launch_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b,
                      const Tensor& blocks, int ratio, float scale, Tensor& out, const ops::OutputGate* gate,
                      const ops::KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2), top = blocks.size(1);
  QsaLayout l = qsa_layout(b, T, ratio);
  const int stride = int(top * ratio + ratio);
  Tensor probs = Tensor::uninitialized({T * H, stride}, DType::kF32, Device::kCUDA);
  qsa_attention_kernel<C><<<dim3(unsigned(T), unsigned(H)), 128, 0, stream()>>>(
      q.ptr<float>(), static_cast<const C*>(k_cache.data()), static_cast<const C*>(v_cache.data()), kv_scales<C>(quant),
      l.meta, blocks.ptr<int32_t>(), int(top), ratio, int(H), int(KVH), int(D), scale, probs.ptr<float>(), stride,
      out.ptr<float>(), gate ? gate->gate->ptr<float>() : nullptr, gate ? gate->gate->size(1) : 0, gate ? gate->column : 0);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void group_rms_norm(const Tensor& x, const Tensor& weight, int64_t group, float eps, Tensor& out) {
  RV_CHECK(weight.dtype() == DType::kF32, "CUDA group_rms_norm: a float32 weight");
  const int64_t T = x.size(0), W = x.size(1);
  if (T == 0) return;
  group_rms_norm_kernel<<<dim3(unsigned(T), unsigned(W / group)), kThreads, 0, stream()>>>(
      x.ptr<float>(), weight.ptr<float>(), out.ptr<float>(), int(group), int(W), eps);
  RV_CUDA_CHECK(cudaGetLastError());
}

void scaled_silu(const Tensor& x, int64_t columns, float scale, Tensor& out) {
  const int64_t n = x.size(0) * columns;
  scaled_silu_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.ptr<float>(), x.size(1), columns, scale, out.ptr<float>(), n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void hc_mix(const Tensor& normed, const Tensor& mix_logits, Tensor& out) {
  const int64_t n = out.numel(), E = out.size(1);
  hc_mix_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(normed.ptr<float>(), mix_logits.ptr<float>(), out.ptr<float>(), E,
                                                           int(normed.size(1) / E), n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void hc_combine(Tensor& streams, const Tensor& y, const Tensor& logits, int64_t column, float scale) {
  const int64_t n = streams.numel(), E = y.size(1);
  hc_combine_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(streams.ptr<float>(), y.ptr<float>(), logits.ptr<float>(),
                                                               logits.size(1), column, scale, E, int(streams.size(1) / E), n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void accumulate(Tensor& out, const Tensor& x) {
  const int64_t n = out.numel();
  accumulate_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(out.ptr<float>(), x.ptr<float>(), n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void ngram_rows(const Tensor& ids, const ops::NgramHash& h, Tensor& windows, const Tensor& seq_starts,
                const Tensor& seq_slots, Tensor& rows) {
  RV_CHECK(h.ngram_size >= 2 && h.ngram_size <= 8, "CUDA ngram_rows: ngram_size 2..8 (got ", h.ngram_size, ")");
  const int S = int(seq_slots.numel());
  if (S == 0) return;
  ngram_rows_kernel<<<unsigned((S + 63) / 64), 64, 0, stream()>>>(
      ids.ptr<int32_t>(), reinterpret_cast<const uint64_t*>(h.multipliers.ptr<int64_t>()), h.sizes.ptr<int64_t>(),
      h.offsets.ptr<int64_t>(), h.ngram_size, h.heads_per_ngram, h.eos, windows.ptr<float>(), seq_starts.ptr<int32_t>(),
      seq_slots.ptr<int32_t>(), S, rows.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, Tensor& out) {
  const int64_t T = value.size(0), E = value.size(1), hc = key.size(1) / E;
  if (T == 0) return;
  ple_gate_kernel<<<unsigned(T * hc), kThreads, 0, stream()>>>(key.ptr<float>(), query.ptr<float>(), value.ptr<float>(),
                                                                out.ptr<float>(), int(E), int(hc));
  RV_CUDA_CHECK(cudaGetLastError());
}

void token_rows_write(const Tensor& x, const Tensor& slot_mapping, Tensor& cache) {
  const int64_t n = x.numel();
  if (n == 0) return;
  token_rows_write_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.ptr<float>(), slot_mapping.ptr<int32_t>(),
                                                                     cache.ptr<float>(), int(x.size(1)), n);
  RV_CUDA_CHECK(cudaGetLastError());
}

void qsa_select(const Tensor& q, const Tensor& key_rows, const ops::QsaIndex& index, const ops::AttentionBatch& b,
                Tensor& blocks) {
  const int64_t T = q.size(0), heads = q.size(1), D = q.size(2), top = blocks.size(1);
  RV_CHECK(D <= 1024 && index.k_norm->dtype() == DType::kF32, "CUDA qsa_select: indexer head_dim up to 1024 (got ", D, ")");
  if (T == 0) return;
  QsaLayout l = qsa_layout(b, T, index.ratio);
  Tensor keys = Tensor::uninitialized({std::max(1, l.total_keys), D}, DType::kF32, Device::kCUDA);
  const int threads = int((D + 31) / 32 * 32), half = index.rope->rotary_dim / 2;
  // Enough blocks to fill the device at one sequence, fewer a sequence at many (a graph's bound on
  // the keys is max_seq_len's, most of which a short context leaves idle).
  const int per_seq = std::min(l.max_keys, std::max(1, 4096 / std::max(1, b.num_seqs)));
  if (l.max_keys > 0)
    qsa_keys_kernel<<<dim3(unsigned(per_seq), unsigned(b.num_seqs)), threads, size_t(D) * 4, stream()>>>(
        key_rows.ptr<float>(), l.meta, index.k_norm->ptr<float>(), index.rope->cos.ptr<float>(),
        index.rope->sin.ptr<float>(), half, int(D), index.ratio, index.eps, keys.ptr<float>());
  Tensor scores = Tensor::uninitialized({T, std::max(1, l.max_keys)}, DType::kF32, Device::kCUDA);
  qsa_select_kernel<<<unsigned(T), kThreads, 0, stream()>>>(q.ptr<float>(), keys.ptr<float>(), l.meta, int(heads), int(D),
                                                            index.ratio, int(top), scores.ptr<float>(),
                                                            std::max(1, l.max_keys), blocks.ptr<int32_t>());
  RV_CUDA_CHECK(cudaGetLastError());
}

void qsa_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b,
                   const Tensor& blocks, int32_t ratio, float scale, Tensor& out, const ops::OutputGate* gate,
                   const ops::KvQuant* quant) {
  if (q.size(0) == 0) return;
  switch (k_cache.dtype()) {
    case DType::kF32: return launch_attention<float>(q, k_cache, v_cache, b, blocks, ratio, scale, out, gate, quant);
    case DType::kF16: return launch_attention<__half>(q, k_cache, v_cache, b, blocks, ratio, scale, out, gate, quant);
    case DType::kF8E4M3: return launch_attention<Fp8>(q, k_cache, v_cache, b, blocks, ratio, scale, out, gate, quant);
    case DType::kI8: return launch_attention<int8_t>(q, k_cache, v_cache, b, blocks, ratio, scale, out, gate, quant);
    default: RV_CHECK(false, "CUDA qsa_attention: a ", dtype_name(k_cache.dtype()), " cache");
  }
}

}  // namespace revolta::cuda
