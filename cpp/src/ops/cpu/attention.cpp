// Paged attention on the CPU. One batch can mix prefill chunks (many query tokens on top of a
// cached prefix) and decode tokens (one query token); each query token attends causally to the
// first (seq_len - q_len + i + 1) positions of its sequence. Work items are (token, kv head,
// context segment): the query heads of one GQA group share each K/V row they load. The cache
// holds float32, float16, E4M3 or int8 rows (ops.h: KvQuant), converted as they are read.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {

namespace {

// Row (slot, KV head) of one cache layer, D values, written from and read as floats in the
// cache's format (ops.h: KvQuant).
class CacheRows {
 public:
  CacheRows(const Tensor& cache, float scale, const Tensor* scales)
      : base_(static_cast<uint8_t*>(cache.data())), dt_(cache.dtype()), kvh_(cache.size(2)), d_(cache.size(3)),
        scale_(scale), scales_(scales && scales->defined() ? scales->ptr<float>() : nullptr) {
    if (dt_ == DType::kF8E4M3)
      for (int i = 0; i < 256; ++i) e4m3_[i] = f8e4m3_to_f32(uint8_t(i)) * scale_;
  }
  void store(int64_t slot, int64_t h, const float* x) {
    const int64_t at = (slot * kvh_ + h) * d_;
    switch (dt_) {
      case DType::kF32:
      case DType::kF16: convert_from_f32(x, base_ + at * int64_t(dtype_size(dt_)), dt_, size_t(d_)); return;
      case DType::kF8E4M3: {
        const float inv = 1.0f / scale_;
        for (int64_t i = 0; i < d_; ++i) base_[at + i] = f32_to_f8e4m3(x[i] * inv);
        return;
      }
      default: {  // int8: a scale per row, absmax / 127
        float amax = 0.0f;
        for (int64_t i = 0; i < d_; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
        auto* o = reinterpret_cast<int8_t*>(base_) + at;
        for (int64_t i = 0; i < d_; ++i) o[i] = int8_t(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
        scales_[slot * kvh_ + h] = s;
      }
    }
  }

  // The row as floats: in place for a float32 cache, else converted into buf [D].
  const float* load(int64_t slot, int64_t h, float* buf) const {
    const int64_t at = (slot * kvh_ + h) * d_;
    switch (dt_) {
      case DType::kF32: return reinterpret_cast<const float*>(base_) + at;
      case DType::kF16: convert_to_f32(base_ + at * 2, dt_, buf, size_t(d_)); return buf;
      case DType::kF8E4M3:
        for (int64_t i = 0; i < d_; ++i) buf[i] = e4m3_[base_[at + i]];
        return buf;
      default: {
        const float s = scales_[slot * kvh_ + h];
        const auto* r = reinterpret_cast<const int8_t*>(base_) + at;
        for (int64_t i = 0; i < d_; ++i) buf[i] = float(r[i]) * s;
        return buf;
      }
    }
  }

 private:
  uint8_t* base_;
  DType dt_;
  int64_t kvh_, d_;
  float scale_;
  float* scales_;
  float e4m3_[256] = {};
};

CacheRows k_rows(const Tensor& cache, const KvQuant* q) { return {cache, q ? q->k : 1.0f, q ? &q->k_rows : nullptr}; }
CacheRows v_rows(const Tensor& cache, const KvQuant* q) { return {cache, q ? q->v : 1.0f, q ? &q->v_rows : nullptr}; }

}  // namespace

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                    Tensor& v_cache, const KvQuant* quant) {
  const int64_t T = k.size(0), KVH = k_cache.size(2), D = k_cache.size(3);
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  RV_CHECK(k.numel() == T * KVH * D && v.numel() == T * KVH * D, "kv_cache_write: k and v [T, kv_heads, head_dim] of ",
           "the cache's ", k_cache.shape_str(), " (got ", k.shape_str(), ")");
  CacheRows kc = k_rows(k_cache, quant), vc = v_rows(v_cache, quant);
  const int32_t* slot = slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;  // a padding row
    RV_CHECK(slot[t] < slots, "kv_cache_write: slot ", slot[t], " out of range");
    for (int64_t h = 0; h < KVH; ++h) {
      kc.store(slot[t], h, k.ptr<float>() + (t * KVH + h) * D);
      vc.store(slot[t], h, v.ptr<float>() + (t * KVH + h) * D);
    }
  }
}

void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& b, float scale, Tensor& out, const OutputGate* gate, const KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(2), BS = b.block_size;
  RV_CHECK(k_cache.size(3) == D && H % KVH == 0, "paged_attention: q ", q.shape_str(),
           " cache ", k_cache.shape_str());
  const int64_t group = H / KVH;
  // token -> sequence lookup
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int32_t s = 0; s < b.num_seqs; ++s)
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) seq_of[size_t(t)] = s;

  const CacheRows kc = k_rows(k_cache, quant), vc = v_rows(v_cache, quant);
  const float* qp = q.ptr<float>();
  float* op = out.ptr<float>();

  // Work items are (token, kv head, context segment). Long contexts with few (token, head) pairs
  // (decode of a few sequences) are split into segments so every thread has work; each segment
  // keeps its own softmax maximum and sum, merged afterwards (flash-decoding style).
  struct Item {
    int64_t t, kvh, j0, j1;
  };
  std::vector<Item> items;
  std::vector<int64_t> first_item(size_t(T * KVH) + 1, 0);
  const int64_t threads = cpu_thread_pool() ? cpu_thread_pool()->size() : 1;
  const int64_t want = 4 * threads;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = seq_of[size_t(t)];
    const int64_t ctx = int64_t(b.seq_lens[s]) - (b.query_start[s + 1] - b.query_start[s]) + (t - b.query_start[s]) + 1;
    const int64_t pieces = T * KVH >= want ? 1 : std::max<int64_t>(1, std::min((want + T * KVH - 1) / (T * KVH), ctx / 128));
    const int64_t len = (ctx + pieces - 1) / pieces;
    for (int64_t kvh = 0; kvh < KVH; ++kvh) {
      first_item[size_t(t * KVH + kvh)] = int64_t(items.size());
      for (int64_t j0 = 0; j0 < ctx; j0 += len) items.push_back({t, kvh, j0, std::min(ctx, j0 + len)});
    }
  }
  first_item[size_t(T * KVH)] = int64_t(items.size());
  // per item and query head of the group: unnormalised output [D], running max, sum
  std::vector<float> part_out(items.size() * size_t(group * D)), part_max(items.size() * size_t(group)),
      part_sum(items.size() * size_t(group));

  parallel_tasks(int64_t(items.size()), [&](int64_t i) {
    const Item& it = items[size_t(i)];
    const int32_t s = seq_of[size_t(it.t)];
    const int32_t* table = b.block_tables + int64_t(s) * b.max_blocks_per_seq;
    const int64_t n = it.j1 - it.j0;
    thread_local std::vector<float> scores, row_buf;
    scores.assign(size_t(group * n), 0.0f);
    row_buf.resize(size_t(D));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = it.j0 + j;
      const float* krow = kc.load(int64_t(table[pos / BS]) * BS + pos % BS, it.kvh, row_buf.data());
      for (int64_t g = 0; g < group; ++g)
        scores[size_t(g * n + j)] = dot_f32(qp + (it.t * H + it.kvh * group + g) * D, krow, D) * scale;
    }
    float* o = part_out.data() + size_t(i) * size_t(group * D);
    std::fill(o, o + group * D, 0.0f);
    for (int64_t g = 0; g < group; ++g) {
      float* sc = scores.data() + g * n;
      const float mx = *std::max_element(sc, sc + n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += sc[j] = std::exp(sc[j] - mx);
      part_max[size_t(i) * size_t(group) + size_t(g)] = mx;
      part_sum[size_t(i) * size_t(group) + size_t(g)] = sum;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = it.j0 + j;
      const float* vrow = vc.load(int64_t(table[pos / BS]) * BS + pos % BS, it.kvh, row_buf.data());
      for (int64_t g = 0; g < group; ++g) axpy_f32(scores[size_t(g * n + j)], vrow, o + g * D, D);
    }
  });

  for (int64_t p = 0; p < T * KVH; ++p) {
    const int64_t t = p / KVH, kvh = p % KVH;
    const int64_t i0 = first_item[size_t(p)], i1 = first_item[size_t(p) + 1];
    for (int64_t g = 0; g < group; ++g) {
      float mx = -INFINITY;
      for (int64_t i = i0; i < i1; ++i) mx = std::max(mx, part_max[size_t(i * group + g)]);
      float total = 0.0f;
      float* dst = op + (t * H + kvh * group + g) * D;
      std::fill(dst, dst + D, 0.0f);
      for (int64_t i = i0; i < i1; ++i) {
        const float w = std::exp(part_max[size_t(i * group + g)] - mx);
        total += w * part_sum[size_t(i * group + g)];
        axpy_f32(w, part_out.data() + size_t(i * group + g) * size_t(D), dst, D);
      }
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < D; ++d) dst[d] *= inv;
    }
  }
  if (gate) {
    Tensor flat = out.view({T, H * D});
    sigmoid_mul(flat, *gate->gate, gate->column);
  }
}

void qsa_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& b,
                   const Tensor& blocks, int32_t ratio, float scale, Tensor& out, const OutputGate* gate,
                   const KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2), BS = b.block_size;
  const int64_t group = H / KVH, top = blocks.size(1);
  RV_CHECK(k_cache.size(3) == D && H % KVH == 0, "qsa_attention: q ", q.shape_str(), " cache ", k_cache.shape_str());
  std::vector<int32_t> seq_of(static_cast<size_t>(T));
  for (int32_t s = 0; s < b.num_seqs; ++s)
    for (int32_t t = b.query_start[s]; t < b.query_start[s + 1]; ++t) seq_of[size_t(t)] = s;
  const CacheRows kc = k_rows(k_cache, quant), vc = v_rows(v_cache, quant);
  const float* qp = q.ptr<float>();
  const int32_t* chosen = blocks.ptr<int32_t>();
  float* op = out.ptr<float>();
  parallel_tasks(T * KVH, [&](int64_t item) {
    const int64_t t = item / KVH, kvh = item % KVH;
    const int32_t s = seq_of[size_t(t)];
    const int64_t pos = int64_t(b.seq_lens[s]) - (b.query_start[s + 1] - b.query_start[s]) + (t - b.query_start[s]);
    const int32_t* table = b.block_tables + int64_t(s) * b.max_blocks_per_seq;
    thread_local std::vector<int64_t> cells;
    thread_local std::vector<float> scores, row_buf;
    cells.clear();
    for (int64_t i = 0; i < top; ++i) {
      const int64_t blk = chosen[t * top + i];
      if (blk < 0) break;
      for (int64_t j = blk * ratio; j < (blk + 1) * ratio; ++j) cells.push_back(j);
    }
    for (int64_t j = (pos + 1) / ratio * ratio; j <= pos; ++j) cells.push_back(j);  // the incomplete tail
    const int64_t n = int64_t(cells.size());
    scores.assign(size_t(group * n), 0.0f);
    row_buf.resize(size_t(D));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t c = cells[size_t(j)];
      const float* krow = kc.load(int64_t(table[c / BS]) * BS + c % BS, kvh, row_buf.data());
      for (int64_t g = 0; g < group; ++g) scores[size_t(g * n + j)] = dot_f32(qp + (t * H + kvh * group + g) * D, krow, D) * scale;
    }
    for (int64_t g = 0; g < group; ++g) {
      float* sc = scores.data() + g * n;
      const float mx = *std::max_element(sc, sc + n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += sc[j] = std::exp(sc[j] - mx);
      for (int64_t j = 0; j < n; ++j) sc[j] /= sum;
      std::fill(op + (t * H + kvh * group + g) * D, op + (t * H + kvh * group + g + 1) * D, 0.0f);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t c = cells[size_t(j)];
      const float* vrow = vc.load(int64_t(table[c / BS]) * BS + c % BS, kvh, row_buf.data());
      for (int64_t g = 0; g < group; ++g) axpy_f32(scores[size_t(g * n + j)], vrow, op + (t * H + kvh * group + g) * D, D);
    }
  });
  if (gate) {
    Tensor flat = out.view({T, H * D});
    sigmoid_mul(flat, *gate->gate, gate->column);
  }
}

void qkv_rope_cache(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& tables,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  Tensor q2 = q.view({T, H * D});
  Tensor k = Tensor::uninitialized({T, KVH, D}, DType::kF32), v = Tensor::uninitialized({T, KVH, D}, DType::kF32);
  Tensor k2 = k.view({T, KVH * D}), v2 = v.view({T, KVH * D});
  cpu::copy_columns(qkv, 0, q2);
  cpu::copy_columns(qkv, H * D, k2);
  cpu::copy_columns(qkv, (H + KVH) * D, v2);
  if (norm.q) cpu::rms_norm(q, *norm.q, norm.eps, q);
  if (norm.k) cpu::rms_norm(k, *norm.k, norm.eps, k);
  cpu::rope(q, positions, tables);
  cpu::rope(k, positions, tables);
  cpu::kv_cache_write(k, v, slot_mapping, k_cache, v_cache, quant);
}

void qkv_rope_attention(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate,
                        const KvQuant* quant) {
  cpu::qkv_rope_cache(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant);
  cpu::paged_attention(q, k_cache, v_cache, batch, scale, out, gate, quant);
}

}  // namespace revolta::ops::cpu
