// Paged attention for batches that mix prefill chunks and decode tokens (same contract as the CPU
// op): one block per (query token, query head, context split); its warps stride over the split's
// positions, each keeping an online softmax (running max, sum, output), merged through shared
// memory. When few (token, head) pairs would leave most SMs idle (decode of few sequences over long
// contexts), the context is split across blocks and a second kernel merges the partial softmaxes
// (split-K). head_dim up to 256 (8 values per lane). GQA groups still re-read K/V per query head.
#include <algorithm>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4, kMaxPerLane = 8;

__global__ void paged_attention_kernel(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                                       const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
                                       const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
                                       int max_blocks, int block_size, int H, int KVH, int D, float scale,
                                       float* __restrict__ out, float* __restrict__ part) {
  const int t = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH), split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = seq_of[t];
  const int q_len = query_start[s + 1] - query_start[s];
  const int ctx = seq_lens[s] - q_len + (t - query_start[s]) + 1;
  const int32_t* table = block_tables + size_t(s) * max_blocks;
  const int per_lane = (D + 31) / 32;
  float qv[kMaxPerLane], acc[kMaxPerLane];
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
    for (int i = 0; i < per_lane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dot += qv[i] * kc[base + d];
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float m_new = fmaxf(m, dot);
    const float corr = __expf(m - m_new), p = __expf(dot - m_new);
    l = l * corr + p;
    for (int i = 0; i < per_lane; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < D ? p * vc[base + d] : 0.0f);
    }
    m = m_new;
  }
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kMaxPerLane * 32];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
  for (int i = 0; i < per_lane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp == 0) {
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w]);
    float total = 0.0f;
    float res[kMaxPerLane] = {};
    for (int w = 0; w < kWarps; ++w) {
      if (sm[w] == -INFINITY) continue;  // a warp that saw no position
      const float c = __expf(sm[w] - mx);
      total += c * sl[w];
      for (int i = 0; i < per_lane; ++i) res[i] += c * sacc[w][lane + 32 * i];
    }
    if (splits == 1) {
      for (int i = 0; i < per_lane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) out[(size_t(t) * H + h) * D + d] = res[i] / total;
      }
    } else {  // partial result of this split: [max, sum, D unnormalised outputs]
      float* p = part + ((size_t(t) * H + h) * splits + split) * (D + 2);
      if (lane == 0) p[0] = mx, p[1] = total;
      for (int i = 0; i < per_lane; ++i) {
        const int d = lane + 32 * i;
        if (d < D) p[2 + d] = res[i];
      }
    }
  }
}

__global__ void merge_splits_kernel(const float* __restrict__ part, int splits, int H, int D, float* __restrict__ out) {
  const int t = blockIdx.x, h = blockIdx.y;
  const float* p = part + (size_t(t) * H + h) * splits * (D + 2);
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

}  // namespace

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& b,
                     float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  RV_CHECK(D <= 32 * kMaxPerLane && H % KVH == 0, "CUDA paged_attention: head_dim ", D, " (<= 256) / heads ", H, "/", KVH);
  if (T == 0) return;
  // The batch metadata lives on the host; the kernel needs it on the device.
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int32_t s = 0; s < b.num_seqs; ++s)
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) seq_of[size_t(t)] = s;
  auto upload = [](const int32_t* p, size_t n) {
    Tensor h = Tensor::wrap(const_cast<int32_t*>(p), {int64_t(n)}, DType::kI32, nullptr);
    return to_device(h);
  };
  Tensor d_qs = upload(b.query_start, size_t(b.num_seqs) + 1), d_lens = upload(b.seq_lens, size_t(b.num_seqs));
  Tensor d_tables = upload(b.block_tables, size_t(b.num_seqs) * size_t(b.max_blocks_per_seq));
  Tensor d_seq = upload(seq_of.data(), seq_of.size());
  // Split the context when (tokens x heads) blocks would leave SMs idle and contexts are long.
  int sms = 0;
  RV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int max_ctx = 0;
  for (int32_t s = 0; s < b.num_seqs; ++s) max_ctx = std::max(max_ctx, b.seq_lens[s]);
  int splits = 1;
  if (T * H < 2 * sms) splits = int(std::max<int64_t>(1, std::min<int64_t>((2 * sms + T * H - 1) / (T * H), max_ctx / 256)));
  Tensor part;
  if (splits > 1) part = Tensor::empty({T, H, splits, D + 2}, DType::kF32, Device::kCUDA);
  paged_attention_kernel<<<dim3(unsigned(T), unsigned(H), unsigned(splits)), 32 * kWarps>>>(
      q.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(), d_qs.ptr<int32_t>(), d_lens.ptr<int32_t>(),
      d_tables.ptr<int32_t>(), d_seq.ptr<int32_t>(), b.max_blocks_per_seq, b.block_size, int(H), int(KVH), int(D), scale,
      out.ptr<float>(), splits > 1 ? part.ptr<float>() : nullptr);
  RV_CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    merge_splits_kernel<<<dim3(unsigned(T), unsigned(H)), 128>>>(part.ptr<float>(), splits, int(H), int(D), out.ptr<float>());
    RV_CUDA_CHECK(cudaGetLastError());
  }
  synchronize();  // the uploaded metadata must outlive the kernel
}

}  // namespace revolta::cuda
