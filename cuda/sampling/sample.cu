// Batched sampling on the device (ops::sample; the CPU op in ops/cpu/sampling.cpp is its
// reference). One block of 1024 threads per row:
//   adjust (min_tokens masks, penalties) and temperature into a scratch row;
//   top-k and top-p as radix selects over order-preserving 32-bit keys of the logits (four 8-bit
//   digits; top-p's histogram holds probability mass instead of counts), boundary ties taken in
//   index order through a block scan; min-p as a probability floor;
//   the draw: a block scan of the kept mass in index order finds where `uniform` x mass falls;
//   logprobs of the raw row: log-sum-exp, then N arg-max passes for the top alternatives.
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t key_of(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // larger float -> larger key
}

struct Scratch {
  float f[kWarps];
  double d[kWarps];
  int i[kWarps];
  float bin_mass[256];
  int bin_count[256];
  uint32_t prefix;
  int count_above;
  float mass_above;
  int tie_limit;
  int chosen;
  float fval;
};

__device__ float block_max(float v, Scratch& s) {
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) s.f[threadIdx.x / 32] = v;
  __syncthreads();
  float r = s.f[0];
  for (int w = 1; w < kWarps; ++w) r = fmaxf(r, s.f[w]);
  return r;
}

__device__ double block_sum(double v, Scratch& s) {
  v = warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) s.d[threadIdx.x / 32] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kWarps; ++w) r += s.d[w];
  return r;
}

// Exclusive prefix over threads (in thread order) of a per-thread double.
__device__ double block_exclusive_scan(double v, Scratch& s, double* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == 31) s.d[warp] = inc;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += s.d[w];
    all += s.d[w];
  }
  *total = all;
  return before + inc - v;
}

// Best (value desc, index asc) among entries strictly worse than (pv, pi); returns its index.
__device__ int block_argmax_below(const float* x, int64_t V, float pv, int pi, Scratch& s) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float v = x[i];
    const bool below = v < pv || (v == pv && int(i) > pi);
    if (below && (v > bv || (v == bv && int(i) < bi))) bv = v, bi = int(i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) s.f[threadIdx.x / 32] = bv, s.i[threadIdx.x / 32] = bi;
  __syncthreads();
  bv = s.f[0], bi = s.i[0];
  for (int w = 1; w < kWarps; ++w)
    if (s.f[w] > bv || (s.f[w] == bv && s.i[w] < bi)) bv = s.f[w], bi = s.i[w];
  return bi;
}

// Radix select over keys of the entries with in_set(i): the key K at which the weight (count, or
// probability mass when by_mass) of keys above K stays below `target` while that of keys >= K
// reaches it. Leaves K in s.prefix, the weight strictly above in s.count_above / s.mass_above.
template <typename InSet, typename Weight>
__device__ void radix_select(const float* w, int64_t V, InSet in_set, Weight weight, bool by_mass, double target,
                             Scratch& s) {
  if (threadIdx.x == 0) s.prefix = 0, s.count_above = 0, s.mass_above = 0.0f;
  for (int shift = 24; shift >= 0; shift -= 8) {
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) s.bin_mass[b] = 0.0f, s.bin_count[b] = 0;
    __syncthreads();
    const uint32_t prefix = s.prefix;
    const uint32_t high_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      if (!in_set(i)) continue;
      const uint32_t k = key_of(w[i]);
      if ((k & high_mask) != (prefix & high_mask)) continue;
      const int b = int((k >> shift) & 0xffu);
      if (by_mass) atomicAdd(&s.bin_mass[b], weight(i));
      else atomicAdd(&s.bin_count[b], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double above = by_mass ? double(s.mass_above) : double(s.count_above);
      int b = 255;
      for (; b > 0; --b) {
        const double here = by_mass ? double(s.bin_mass[b]) : double(s.bin_count[b]);
        if (above + here >= target) break;
        above += here;
      }
      if (by_mass) s.mass_above = float(above);
      else s.count_above = int(above);
      s.prefix = (prefix & high_mask) | (uint32_t(b) << shift);
    }
  }
  __syncthreads();
}

// Among entries with in_set(i) and key == s.prefix, in index order: the index of the last one
// needed so that `above` plus their weight reaches `target` (ties at a boundary, lower index first).
template <typename InSet, typename Weight>
__device__ void tie_limit(const float* w, int64_t V, InSet in_set, Weight weight, double above, double target,
                          Scratch& s) {
  const uint32_t kk = s.prefix;
  const int64_t chunk = (V + kThreads - 1) / kThreads, b = threadIdx.x * chunk, e = min(V, b + chunk);
  double mine = 0.0;
  for (int64_t i = b; i < e; ++i)
    if (in_set(i) && key_of(w[i]) == kk) mine += weight(i);
  double total = 0.0;
  double acc = above + block_exclusive_scan(mine, s, &total);
  if (threadIdx.x == 0) s.tie_limit = int(V) - 1;
  __syncthreads();
  if (acc < target && acc + mine >= target) {
    for (int64_t i = b; i < e; ++i)
      if (in_set(i) && key_of(w[i]) == kk) {
        acc += weight(i);
        if (acc >= target) {
          s.tie_limit = int(i);
          break;
        }
      }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* __restrict__ logits, float* __restrict__ scratch,
                                                          int64_t V, const ops::SampleRow* __restrict__ rows,
                                                          const ops::SampleAdjust* __restrict__ adjust,
                                                          ops::SampleResult* __restrict__ out) {
  __shared__ Scratch s;
  const ops::SampleRow p = rows[blockIdx.x];
  const float* raw = logits + blockIdx.x * V;
  float* w = scratch + blockIdx.x * V;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) w[i] = raw[i];
  __syncthreads();
  for (int a = p.adjust_begin + int(threadIdx.x); a < p.adjust_end; a += kThreads) {  // one entry per token
    const ops::SampleAdjust e = adjust[a];
    float x = w[e.token];
    x += e.bias;
    if (e.masked) x = -INFINITY;
    if (e.seen && p.repetition_penalty != 1.0f) x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    if (e.out_count > 0) x -= p.frequency_penalty * float(e.out_count) + p.presence_penalty;
    w[e.token] = x;
  }
  __syncthreads();
  ops::SampleResult& o = out[blockIdx.x];
  if (p.temperature <= 1e-5f) {
    const int t = block_argmax_below(w, V, INFINITY, -1, s);
    if (threadIdx.x == 0) o.token = t;
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) w[i] = w[i] / p.temperature;
    __syncthreads();
    float local = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) local = fmaxf(local, w[i]);
    const float mx = block_max(local, s);
    // top-k: keys above kk, plus ties at kk up to index lim_k.
    const bool use_k = p.top_k > 0 && p.top_k < V;
    uint32_t kk = 0;
    int lim_k = int(V) - 1;
    auto all = [](int64_t) { return true; };
    auto one = [](int64_t) { return 1.0f; };
    if (use_k) {
      radix_select(w, V, all, one, false, double(p.top_k), s);
      kk = s.prefix;
      tie_limit(w, V, all, one, double(s.count_above), double(p.top_k), s);
      lim_k = s.tie_limit;
    }
    auto in_k = [&](int64_t i) {
      if (!use_k) return true;
      const uint32_t k = key_of(w[i]);
      return k > kk || (k == kk && i <= lim_k);
    };
    auto prob = [&](int64_t i) { return __expf(w[i] - mx); };
    double local_sum = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kThreads)
      if (in_k(i)) local_sum += prob(i);
    const double sum = block_sum(local_sum, s);
    // top-p: the fewest best tokens whose mass reaches top_p of the top-k mass.
    const bool use_p = p.top_p < 1.0f;
    uint32_t kp = 0;
    int lim_p = int(V) - 1;
    if (use_p) {
      const double target = double(p.top_p) * sum;
      radix_select(w, V, in_k, prob, true, target, s);
      kp = s.prefix;
      tie_limit(w, V, in_k, prob, double(s.mass_above), target, s);
      lim_p = s.tie_limit;
    }
    auto kept = [&](int64_t i) {
      if (!in_k(i)) return false;
      if (use_p) {
        const uint32_t k = key_of(w[i]);
        if (!(k > kp || (k == kp && i <= lim_p))) return false;
      }
      return p.min_p <= 0.0f || w[i] == mx || prob(i) >= p.min_p;
    };
    // The draw, in index order.
    const int64_t chunk = (V + kThreads - 1) / kThreads, b = threadIdx.x * chunk, e = min(V, b + chunk);
    double mine = 0.0;
    int last = -1;
    for (int64_t i = b; i < e; ++i)
      if (kept(i)) mine += prob(i), last = int(i);
    double total = 0.0;
    double acc = block_exclusive_scan(mine, s, &total);
    const double target = double(p.uniform) * total;
    if (threadIdx.x == 0) s.chosen = -1;
    __syncthreads();
    if (mine > 0.0 && acc <= target && target < acc + mine) {
      for (int64_t i = b; i < e; ++i)
        if (kept(i)) {
          acc += prob(i);
          if (target < acc) {
            s.chosen = int(i);
            break;
          }
        }
      if (s.chosen < 0) s.chosen = last;
    }
    __syncthreads();
    if (s.chosen < 0) {  // rounding left the target past the end: the last kept token
      int lk = -1;
      for (int64_t i = threadIdx.x; i < V; i += kThreads)
        if (kept(i)) lk = max(lk, int(i));
      lk = warp_max(lk);
      __syncthreads();
      if (threadIdx.x % 32 == 0) s.i[threadIdx.x / 32] = lk;
      __syncthreads();
      if (threadIdx.x == 0) {
        int m = -1;
        for (int wi = 0; wi < kWarps; ++wi) m = max(m, s.i[wi]);
        s.chosen = m;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) o.token = s.chosen;
  }
  if (p.num_logprobs < 0) return;
  __syncthreads();
  float local = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) local = fmaxf(local, raw[i]);
  const float mx = block_max(local, s);
  double se = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) se += exp(double(raw[i] - mx));
  const float lse = mx + float(log(block_sum(se, s)));
  __syncthreads();
  if (threadIdx.x == 0) o.logprob = raw[o.token] - lse;
  float pv = INFINITY;
  int pi = -1;
  const int n = min(min(p.num_logprobs, ops::kMaxTopLogprobs), int(V));
  for (int j = 0; j < n; ++j) {
    const int t = block_argmax_below(raw, V, pv, pi, s);
    if (threadIdx.x == 0) o.top_ids[j] = t, o.top_logprobs[j] = raw[t] - lse;
    pv = raw[t], pi = t;
  }
}

}  // namespace

void sample(const Tensor& logits, const std::vector<ops::SampleRow>& rows, const std::vector<ops::SampleAdjust>& adjust,
            std::vector<ops::SampleResult>& out) {
  const int64_t R = int64_t(rows.size()), V = logits.numel() / std::max<int64_t>(R, 1);
  out.assign(size_t(R), ops::SampleResult{});
  if (R == 0) return;
  const size_t rb = rows.size() * sizeof(ops::SampleRow), ab = adjust.size() * sizeof(ops::SampleAdjust);
  Tensor meta = Tensor::uninitialized({int64_t(rb + ab + 16)}, DType::kU8, Device::kCUDA);
  Tensor res = Tensor::uninitialized({int64_t(out.size() * sizeof(ops::SampleResult))}, DType::kU8, Device::kCUDA);
  Tensor scratch = Tensor::uninitialized({R, V}, DType::kF32, Device::kCUDA);
  char* m = meta.ptr<char>();
  RV_CUDA_CHECK(cudaMemcpyAsync(m, rows.data(), rb, cudaMemcpyHostToDevice, stream()));
  if (ab) RV_CUDA_CHECK(cudaMemcpyAsync(m + rb, adjust.data(), ab, cudaMemcpyHostToDevice, stream()));
  sample_kernel<<<unsigned(R), kThreads, 0, stream()>>>(
      logits.ptr<float>(), scratch.ptr<float>(), V, reinterpret_cast<const ops::SampleRow*>(m),
      reinterpret_cast<const ops::SampleAdjust*>(m + rb), res.ptr<ops::SampleResult>());
  RV_CUDA_CHECK(cudaGetLastError());
  RV_CUDA_CHECK(cudaMemcpyAsync(out.data(), res.data(), out.size() * sizeof(ops::SampleResult), cudaMemcpyDeviceToHost,
                                stream()));
  synchronize();
}

}  // namespace revolta::cuda
