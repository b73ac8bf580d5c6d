// Flash-Next's ops on the CPU: hyper-connection mix and combine, n-gram PLE hashing and gating,
// and QSA's block choice (the contracts in ops/ops.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

void rms_group(const float* x, const float* w, float eps, int64_t n, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

}  // namespace

void group_rms_norm(const Tensor& x, const Tensor& weight, int64_t group, float eps, Tensor& out) {
  const int64_t T = x.size(0), W = x.size(1);
  RV_CHECK(weight.dtype() == DType::kF32, "group_rms_norm: a float32 weight (got ", dtype_name(weight.dtype()), ")");
  const Tensor& w = weight;
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  parallel_range(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t g = 0; g < W; g += group) rms_group(xp + t * W + g, w.ptr<float>() + g, eps, group, op + t * W + g);
  });
}

void scaled_silu(const Tensor& x, int64_t columns, float scale, Tensor& out) {
  const int64_t T = x.size(0), W = x.size(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < columns; ++c) {
      const float v = scale * x.ptr<float>()[t * W + c];
      out.ptr<float>()[t * columns + c] = v * sigmoid(v);
    }
}

void hc_mix(const Tensor& normed, const Tensor& mix_logits, Tensor& out) {
  const int64_t T = out.size(0), E = out.size(1), hc = normed.size(1) / E;
  const float* n = normed.ptr<float>();
  const float* m = mix_logits.ptr<float>();
  float* o = out.ptr<float>();
  parallel_range(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t e = 0; e < E; ++e) {
        float acc = 0.0f;
        for (int64_t c = 0; c < hc; ++c) acc += sigmoid(m[(t * hc + c) * E + e]) * n[(t * hc + c) * E + e];
        o[t * E + e] = acc / float(hc);
      }
  });
}

void hc_combine(Tensor& streams, const Tensor& y, const Tensor& logits, int64_t column, float scale) {
  const int64_t T = y.size(0), E = y.size(1), hc = streams.size(1) / E, L = logits.size(1);
  float* s = streams.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < hc; ++c) {
      const float w = 2.0f * sigmoid(scale * logits.ptr<float>()[t * L + column + c]);
      axpy_f32(w, y.ptr<float>() + t * E, s + (t * hc + c) * E, E);
    }
}

void accumulate(Tensor& out, const Tensor& x) {
  float* o = out.ptr<float>();
  const float* p = x.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] += p[i];
}

void ngram_rows(const Tensor& ids, const NgramHash& h, Tensor& windows, const Tensor& seq_starts,
                const Tensor& seq_slots, Tensor& rows) {
  const int64_t N = h.ngram_size, back = N - 1, heads = rows.size(1);
  const int32_t* tok = ids.ptr<int32_t>();
  const int32_t* st = seq_starts.ptr<int32_t>();
  const uint64_t* mult = reinterpret_cast<const uint64_t*>(h.multipliers.ptr<int64_t>());
  const int64_t* sizes = h.sizes.ptr<int64_t>();
  const int64_t* offsets = h.offsets.ptr<int64_t>();
  int32_t* out = rows.ptr<int32_t>();
  std::vector<int64_t> ctx(static_cast<size_t>(N));
  for (int64_t s = 0; s < seq_slots.numel(); ++s) {
    const int32_t slot = seq_slots.ptr<int32_t>()[s];
    RV_CHECK(slot >= 0, "ngram_rows: a sequence without a state slot");
    float* win = windows.ptr<float>() + int64_t(slot) * back;  // previous tokens, newest first, id + 1
    for (int64_t t = st[s]; t < st[s + 1]; ++t) {
      ctx[0] = tok[t];
      bool cut = false;  // an EOS (or the sequence start) between: this and older slots read EOS
      for (int64_t j = 1; j < N; ++j) {
        const int64_t from_batch = t - j >= st[s] ? tok[t - j] : -1;
        const int64_t prev = t - j >= st[s] ? from_batch : int64_t(win[j - (t - st[s]) - 1]) - 1;
        cut = cut || prev < 0 || prev == h.eos;
        ctx[size_t(j)] = cut ? h.eos : prev;
      }
      for (int64_t n = 2; n <= N; ++n) {
        uint64_t m = 0;
        for (int64_t j = 0; j < n; ++j) m ^= uint64_t(ctx[size_t(j)]) * mult[j];
        for (int64_t i = 0; i < h.heads_per_ngram; ++i) {
          const int64_t head = (n - 2) * h.heads_per_ngram + i;
          out[t * heads + head] = int32_t(int64_t(m % uint64_t(sizes[head])) + offsets[head]);
        }
      }
    }
    // The window after the sequence's tokens: its last `back` tokens, newest first.
    const int64_t count = st[s + 1] - st[s];
    std::vector<float> next(static_cast<size_t>(back));
    for (int64_t j = 0; j < back; ++j)
      next[size_t(j)] = j < count ? float(tok[st[s + 1] - 1 - j] + 1) : win[j - count];
    std::copy(next.begin(), next.end(), win);
  }
}

void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, Tensor& out) {
  const int64_t T = value.size(0), E = value.size(1), hc = key.size(1) / E;
  const float inv = 1.0f / std::sqrt(float(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < hc; ++c) {
      const int64_t at = (t * hc + c) * E;
      const float s = dot_f32(key.ptr<float>() + at, query.ptr<float>() + at, E) * inv;
      const float g = sigmoid((s > 0.0f ? 1.0f : s < 0.0f ? -1.0f : 0.0f) * std::sqrt(std::max(std::fabs(s), 1e-6f)));
      for (int64_t e = 0; e < E; ++e) out.ptr<float>()[at + e] = g * value.ptr<float>()[t * E + e];
    }
}

void token_rows_write(const Tensor& x, const Tensor& slot_mapping, Tensor& cache) {
  const int64_t T = x.size(0), W = x.size(1), slots = cache.size(0) * cache.size(1);
  const int32_t* slot = slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (slot[t] < 0) continue;  // a padding row
    RV_CHECK(slot[t] < slots, "token_rows_write: slot ", slot[t], " out of range");
    std::copy(x.ptr<float>() + t * W, x.ptr<float>() + (t + 1) * W, cache.ptr<float>() + int64_t(slot[t]) * W);
  }
}

void qsa_select(const Tensor& q, const Tensor& key_rows, const QsaIndex& index, const AttentionBatch& b,
                Tensor& blocks) {
  const int64_t heads = q.size(1), D = q.size(2), top = blocks.size(1), r = index.ratio, BS = b.block_size;
  int32_t* out = blocks.ptr<int32_t>();
  std::fill(out, out + blocks.numel(), -1);
  for (int32_t s = 0; s < b.num_seqs; ++s) {
    const int64_t q0 = b.query_start[s], q1 = b.query_start[s + 1], len = b.seq_lens[s];
    const int64_t nb = len / r;  // the complete blocks the sequence's last query sees
    if (q1 == q0 || nb == 0) continue;
    const int32_t* table = b.block_tables + int64_t(s) * b.max_blocks_per_seq;
    // Block keys: the mean of the block's raw rows, normalised, rotated to the block's start.
    Tensor keys = Tensor::empty({nb, 1, D}, DType::kF32), starts = Tensor::empty({nb}, DType::kI32);
    for (int64_t blk = 0; blk < nb; ++blk) {
      float* k = keys.ptr<float>() + blk * D;
      for (int64_t j = blk * r; j < (blk + 1) * r; ++j) {
        const float* row = key_rows.ptr<float>() + (int64_t(table[j / BS]) * BS + j % BS) * D;
        for (int64_t d = 0; d < D; ++d) k[d] += row[d];
      }
      for (int64_t d = 0; d < D; ++d) k[d] /= float(r);
      starts.ptr<int32_t>()[blk] = int32_t(blk * r);
    }
    cpu::rms_norm(keys, *index.k_norm, index.eps, keys);
    cpu::rope(keys, starts, *index.rope);
    parallel_tasks(q1 - q0, [&](int64_t i) {
      const int64_t t = q0 + i, pos = len - (q1 - q0) + i, visible = (pos + 1) / r;
      std::vector<float> score(static_cast<size_t>(visible), 0.0f);
      for (int64_t blk = 0; blk < visible; ++blk)
        for (int64_t h = 0; h < heads; ++h)
          score[size_t(blk)] += std::max(0.0f, dot_f32(q.ptr<float>() + (t * heads + h) * D, keys.ptr<float>() + blk * D, D));
      std::vector<int32_t> order(static_cast<size_t>(visible));
      std::iota(order.begin(), order.end(), 0);
      const int64_t keep = std::min(top, visible);
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t c) {
        return score[size_t(a)] > score[size_t(c)] || (score[size_t(a)] == score[size_t(c)] && a < c);
      });
      std::sort(order.begin(), order.begin() + keep);
      std::copy(order.begin(), order.begin() + keep, out + t * top);
    });
  }
}

}  // namespace revolta::ops::cpu
