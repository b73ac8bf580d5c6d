// What the op harness's cases share: random inputs, the pass/fail report, timing, attention
// batches over shuffled block tables, and the host/device copies they compare.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_ops.h"
#include "model/model_config.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::harness {

inline int g_passed = 0, g_failed = 0;
inline bool g_perf = false;
inline std::string g_perf_only;  // --perf=SUBSTRING times only the cases whose name contains it
inline std::mt19937 g_rng(1234);

// 4-bit group weights (quant/int4_groups.h): random nibbles, scales around `scale` / 8 and zero
// points over 0..15.
inline Tensor random_int4(int64_t N, int64_t K, DType dt, float scale) {
  Tensor t = Tensor::empty({N, K}, dt);
  auto* b = static_cast<uint8_t*>(t.data());
  std::uniform_int_distribution<int> byte(0, 255), zero(0, 15);
  std::uniform_real_distribution<float> s(0.05f * scale, 0.2f * scale);
  const int64_t values = dtype_block_values(dt), block = dtype_bytes(dt, values);
  for (int64_t i = 0; i < N * K / values; ++i) {
    for (int g = 0; g < 4; ++g) {  // four groups a block: their headers first
      const uint16_t head[2] = {f32_to_f16(s(g_rng)), f32_to_f16(float(zero(g_rng)))};
      std::memcpy(b + i * block + 4 * g, head, 4);
    }
    for (int64_t j = 16; j < block; ++j) b[i * block + j] = uint8_t(byte(g_rng));
  }
  return t;
}

inline Tensor random_tensor(std::vector<int64_t> shape, DType dt = DType::kF32, float scale = 1.0f) {
  if (is_block_dtype(dt)) return random_int4(shape.at(0), shape.at(1), dt, scale);
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  std::normal_distribution<float> nd(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = nd(g_rng);
  if (dt == DType::kF32) return t;
  Tensor c = Tensor::empty(t.shape(), dt);
  convert_from_f32(t.ptr<float>(), c.data(), dt, size_t(t.numel()));
  return c;
}

// A copy of a host tensor (for a CPU op that updates its input in place).
inline Tensor host_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.data(), t.data(), t.nbytes());
  return c;
}

inline float max_abs_diff(const Tensor& a, const Tensor& b) {
  float m = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.ptr<float>()[i] - b.ptr<float>()[i]));
  return m;
}

inline float max_abs(const Tensor& a) {
  float m = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.ptr<float>()[i]));
  return m;
}

inline void report(const std::string& name, float err, float tol) {
  const bool ok = err <= tol && !std::isnan(err);
  (ok ? g_passed : g_failed)++;
  std::printf("%-4s %-48s max|err| %.3g (tol %.1g)\n", ok ? "ok" : "FAIL", name.c_str(), err, tol);
}

inline void perf(const std::string& name, double bytes, const std::function<void()>& run, double flops = 0.0) {
  if (!g_perf || name.find(g_perf_only) == std::string::npos) return;
  run();
  cuda::synchronize();
  const int reps = 50;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) run();
  cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  if (flops > 0)
    std::printf("perf %-48s %8.2f us  %8.1f GB/s  %6.1f TFLOP/s\n", name.c_str(), s * 1e6, bytes / s / 1e9, flops / s / 1e12);
  else
    std::printf("perf %-48s %8.2f us  %8.1f GB/s\n", name.c_str(), s * 1e6, bytes / s / 1e9);
}

// RoPE tables of `positions` rows on the host and their copy on the device (rc: the type and its
// parameters; "default" unless given).
inline std::pair<ops::RopeTables, ops::RopeTables> rope_tables(int64_t D, double partial, int32_t positions,
                                                        RopeConfig rc = {}) {
  rc.partial_rotary_factor = partial;
  ops::RopeTables host = build_rope_tables(rc, int32_t(D), positions), dev = host;
  dev.cos = cuda::to_device(host.cos);
  dev.sin = cuda::to_device(host.sin);
  return {host, dev};
}

// A batch of sequences, each with a cached prefix and new query tokens (prefill chunks of several
// tokens next to decode tokens), with block tables over a shuffled pool of blocks; on_device()
// adds the device mirrors, as the runner hands them (+ decode_only when every sequence decodes).
// Not copyable: `b` points into the vectors.
struct TestBatch {
  std::vector<int32_t> qs{0}, lens, tables, seq_of;
  int total_blocks = 0, T = 0, max_blocks = 0;
  bool all_decode = true;
  ops::AttentionBatch b;
  Tensor dmeta;

  TestBatch(const std::vector<std::pair<int, int>>& seqs /* (cached, new) */, int bs) {
    for (auto [cached, fresh] : seqs) {
      const int nb = (cached + fresh + bs - 1) / bs;
      total_blocks += nb;
      max_blocks = std::max(max_blocks, nb);
      T += fresh;
      all_decode &= fresh == 1;
    }
    std::vector<int32_t> perm(static_cast<size_t>(total_blocks));
    for (int i = 0; i < total_blocks; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), g_rng);
    int next = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [cached, fresh] = seqs[s];
      qs.push_back(qs.back() + fresh);
      lens.push_back(cached + fresh);
      const int nb = (cached + fresh + bs - 1) / bs;
      for (int i = 0; i < max_blocks; ++i) tables.push_back(i < nb ? perm[size_t(next + i)] : 0);
      for (int i = 0; i < fresh; ++i) seq_of.push_back(int32_t(s));
      next += nb;
    }
    b.query_start = qs.data();
    b.seq_lens = lens.data();
    b.block_tables = tables.data();
    b.num_seqs = int32_t(seqs.size());
    b.max_blocks_per_seq = max_blocks;
    b.block_size = bs;
  }
  TestBatch(const TestBatch&) = delete;
  TestBatch& operator=(const TestBatch&) = delete;

  // The cache slot of token row t (block * bs + offset).
  int32_t slot(int t) const {
    const int s = seq_of[size_t(t)], p = lens[size_t(s)] - (qs[size_t(s) + 1] - t);
    return tables[size_t(s) * max_blocks + p / b.block_size] * b.block_size + p % b.block_size;
  }
  int32_t position(int t) const {
    const int s = seq_of[size_t(t)];
    return lens[size_t(s)] - (qs[size_t(s) + 1] - t);
  }

  void on_device(int graph_max_len) {
    std::vector<int32_t> all(qs);
    all.insert(all.end(), lens.begin(), lens.end());
    all.insert(all.end(), tables.begin(), tables.end());
    all.insert(all.end(), seq_of.begin(), seq_of.end());
    Tensor h = Tensor::empty({int64_t(all.size())}, DType::kI32);
    std::copy(all.begin(), all.end(), h.ptr<int32_t>());
    dmeta = cuda::to_device(h);
    const int32_t* d = dmeta.ptr<int32_t>();
    b.dev_query_start = d;
    b.dev_seq_lens = d + qs.size();
    b.dev_block_tables = d + qs.size() + lens.size();
    b.dev_token_seq = d + qs.size() + lens.size() + tables.size();
    // A captured graph sizes the split grid for the longest context it may meet (max_model_len).
    b.max_seq_len = std::max(graph_max_len, *std::max_element(lens.begin(), lens.end()));
    b.decode_only = all_decode;
  }
};

// The KV pool [blocks, bs, KVH, D] on the host (rounded to kv_dtype's values) and on the device.
inline std::pair<Tensor, Tensor> random_cache(int blocks, int bs, int KVH, int D, DType kv_dtype) {
  Tensor h = random_tensor({blocks, bs, KVH, D});
  if (kv_dtype == DType::kF32) return {h, cuda::to_device(h)};
  Tensor c = Tensor::empty(h.shape(), kv_dtype);  // the reference sees the same f16-rounded cache
  convert_from_f32(h.ptr<float>(), c.data(), kv_dtype, size_t(h.numel()));
  convert_to_f32(c.data(), kv_dtype, h.ptr<float>(), size_t(h.numel()));
  return {h, cuda::to_device(c)};
}

// A device tensor as f32 on the host.
inline Tensor host_f32(const Tensor& t) {
  Tensor h = cuda::to_host(t), f = Tensor::empty(h.shape(), DType::kF32);
  convert_to_f32(h.data(), h.dtype(), f.ptr<float>(), size_t(h.numel()));
  return f;
}

// The quantized KV cache's cases (kv_quant_cases.cpp).
void run_kv_quant_cases();
void run_transfer_cases();
void run_flash_next_cases();
void run_vision_cases();
void run_spec_cases();  // spec_cases.cpp: speculative drafts' ops

}  // namespace revolta::harness
