// Paged attention for batches that mix prefill chunks and decode tokens (same contract as the CPU
// op): one block per (query token, query head); its warps stride over the context, each keeping an
// online softmax (running max, sum, output), merged through shared memory at the end. head_dim up
// to 256 (8 values per lane). A first, correct version: GQA groups re-read K/V per query head and
// long contexts are not yet split across blocks (split-K is the next step for decode).
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4, kMaxPerLane = 8;

__global__ void paged_attention_kernel(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                                       const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
                                       const int32_t* __restrict__ block_tables, const int32_t* __restrict__ seq_of,
                                       int max_blocks, int block_size, int H, int KVH, int D, float scale,
                                       float* __restrict__ out) {
  const int t = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH);
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
  for (int j = warp; j < ctx; j += kWarps) {
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
    for (int i = 0; i < per_lane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) out[(size_t(t) * H + h) * D + d] = res[i] / total;
    }
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
  paged_attention_kernel<<<dim3(unsigned(T), unsigned(H)), 32 * kWarps>>>(
      q.ptr<float>(), k_cache.ptr<float>(), v_cache.ptr<float>(), d_qs.ptr<int32_t>(), d_lens.ptr<int32_t>(),
      d_tables.ptr<int32_t>(), d_seq.ptr<int32_t>(), b.max_blocks_per_seq, b.block_size, int(H), int(KVH), int(D), scale,
      out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
  synchronize();  // the uploaded metadata must outlive the kernel
}

}  // namespace revolta::cuda
