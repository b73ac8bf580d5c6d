// Paged attention on the CPU. One batch can mix prefill chunks (many query tokens on top of a
// cached prefix) and decode tokens (one query token); each query token attends causally to the
// first (seq_len - q_len + i + 1) positions of its sequence. Work items are (token, kv head):
// the query heads of one GQA group share each K/V row they load.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                    Tensor& v_cache) {
  RV_CHECK(k_cache.dtype() == DType::kF32, "kv_cache_write: the CPU KV cache is float32");
  const int64_t T = k.size(0);
  const int64_t row = k.numel() / T;  // kv_heads * head_dim
  const int64_t slots = k_cache.numel() / row;
  const int32_t* slot = slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    RV_CHECK(slot[t] >= 0 && slot[t] < slots, "kv_cache_write: slot ", slot[t], " out of range");
    std::copy_n(k.ptr<float>() + t * row, row, k_cache.ptr<float>() + int64_t(slot[t]) * row);
    std::copy_n(v.ptr<float>() + t * row, row, v_cache.ptr<float>() + int64_t(slot[t]) * row);
  }
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(2), BS = b.block_size;
  RV_CHECK(k_cache.size(3) == D && H % KVH == 0, "paged_attention: q ", q.shape_str(),
           " cache ", k_cache.shape_str());
  const int64_t group = H / KVH;
  // token -> sequence lookup
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int32_t s = 0; s < b.num_seqs; ++s)
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) seq_of[size_t(t)] = s;

  const float* kc = k_cache.ptr<float>();
  const float* vc = v_cache.ptr<float>();
  const float* qp = q.ptr<float>();
  float* op = out.ptr<float>();
  const int64_t row = KVH * D;  // floats per cached token

  parallel_range(T * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / KVH, kvh = item % KVH;
      const int32_t s = seq_of[size_t(t)];
      const int32_t q_len = b.query_start[s + 1] - b.query_start[s];
      const int64_t ctx = int64_t(b.seq_lens[s]) - q_len + (t - b.query_start[s]) + 1;
      const int32_t* table = b.block_tables + int64_t(s) * b.max_blocks_per_seq;
      scores.assign(size_t(group * ctx), 0.0f);
      for (int64_t j = 0; j < ctx; ++j) {
        const float* krow = kc + (int64_t(table[j / BS]) * BS + j % BS) * row + kvh * D;
        for (int64_t g = 0; g < group; ++g) {
          const float* qv = qp + (t * H + kvh * group + g) * D;
          scores[size_t(g * ctx + j)] = dot_f32(qv, krow, D) * scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* sc = scores.data() + g * ctx;
        float mx = *std::max_element(sc, sc + ctx);
        float sum = 0.0f;
        for (int64_t j = 0; j < ctx; ++j) {
          sc[j] = std::exp(sc[j] - mx);
          sum += sc[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < ctx; ++j) sc[j] *= inv;
        float* o = op + (t * H + kvh * group + g) * D;
        std::fill(o, o + D, 0.0f);
      }
      for (int64_t j = 0; j < ctx; ++j) {
        const float* vrow = vc + (int64_t(table[j / BS]) * BS + j % BS) * row + kvh * D;
        for (int64_t g = 0; g < group; ++g)
          axpy_f32(scores[size_t(g * ctx + j)], vrow, op + (t * H + kvh * group + g) * D, D);
      }
    }
  });
}

}  // namespace revolta::ops::cpu
