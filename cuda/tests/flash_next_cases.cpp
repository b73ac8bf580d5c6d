// The op harness's cases for Flash-Next's ops (hyper-connections, n-gram PLE, QSA): each CUDA op
// against the CPU's, at the real model's widths (hidden 2048, four streams, rank 320) and at odd
// ones, with ragged batches over shuffled block tables.
#include "harness.h"

namespace revolta::harness {
namespace {

Tensor ints(const std::vector<int64_t>& v, DType dt) {
  Tensor t = Tensor::empty({int64_t(v.size())}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kI64) t.ptr<int64_t>()[i] = v[i];
    else t.ptr<int32_t>()[i] = int32_t(v[i]);
  }
  return t;
}

int mismatches(const Tensor& a, const Tensor& b) {
  int n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += a.ptr<int32_t>()[i] != b.ptr<int32_t>()[i];
  return n;
}

void test_hyper_connections(int64_t T, int64_t hc, int64_t E, int64_t rank) {
  const std::string tag = " T" + std::to_string(T) + " hc" + std::to_string(hc) + " E" + std::to_string(E);
  Tensor streams = random_tensor({T, hc * E}), w = random_tensor({hc * E});
  Tensor normed = Tensor::empty(streams.shape(), DType::kF32), dnormed = Tensor::empty(streams.shape(), DType::kF32, Device::kCUDA);
  ops::cpu::group_rms_norm(streams, w, E, 1e-6f, normed);
  ops::group_rms_norm(cuda::to_device(streams), cuda::to_device(w), E, 1e-6f, dnormed);
  report("group_rms_norm" + tag, max_abs_diff(cuda::to_host(dnormed), normed), 1e-4f);

  Tensor low = random_tensor({T, rank + hc}, DType::kF32, 3.0f);
  Tensor act = Tensor::empty({T, rank}, DType::kF32), dact = Tensor::empty({T, rank}, DType::kF32, Device::kCUDA);
  ops::cpu::scaled_silu(low, rank, 1.0f / float(hc), act);
  ops::scaled_silu(cuda::to_device(low), rank, 1.0f / float(hc), dact);
  report("scaled_silu" + tag + " rank" + std::to_string(rank), max_abs_diff(cuda::to_host(dact), act), 1e-6f);

  Tensor logits = random_tensor({T, hc * E}, DType::kF32, 2.0f);
  Tensor mixed = Tensor::empty({T, E}, DType::kF32), dmixed = Tensor::empty({T, E}, DType::kF32, Device::kCUDA);
  ops::cpu::hc_mix(normed, logits, mixed);
  ops::hc_mix(cuda::to_device(normed), cuda::to_device(logits), dmixed);
  report("hc_mix" + tag, max_abs_diff(cuda::to_host(dmixed), mixed), 1e-5f);

  Tensor y = random_tensor({T, E}), dstreams = cuda::to_device(streams);
  Tensor combined = host_copy(streams);
  ops::cpu::hc_combine(combined, y, low, rank, 1.0f / float(hc));
  ops::hc_combine(dstreams, cuda::to_device(y), cuda::to_device(low), rank, 1.0f / float(hc));
  report("hc_combine" + tag, max_abs_diff(cuda::to_host(dstreams), combined), 1e-5f);

  Tensor sum = host_copy(streams), dsum = cuda::to_device(streams);
  ops::cpu::accumulate(sum, normed);
  ops::accumulate(dsum, cuda::to_device(normed));
  report("accumulate" + tag, max_abs_diff(cuda::to_host(dsum), sum), 1e-6f);

  Tensor key = random_tensor({T, hc * E}), value = random_tensor({T, E});
  Tensor gated = Tensor::empty(key.shape(), DType::kF32), dgated = Tensor::empty(key.shape(), DType::kF32, Device::kCUDA);
  ops::cpu::ple_gate(key, normed, value, gated);
  ops::ple_gate(cuda::to_device(key), cuda::to_device(normed), cuda::to_device(value), dgated);
  report("ple_gate" + tag, max_abs_diff(cuda::to_host(dgated), gated), 1e-4f);
}

// Three sequences (one with an EOS inside, one of a token, one behind a half-empty window) in
// slots 3, 0 and 1 of four: rows and the advanced windows.
void test_ngram_rows(int ngram, int per_ngram) {
  const int eos = 2, heads = (ngram - 1) * per_ngram;
  std::vector<int64_t> tokens{17, 400, 2, 9, 9, 31, 7, 88, 5, 6, 7, 8, 2};
  Tensor ids = ints(tokens, DType::kI32), starts = ints({0, 7, 8, 13}, DType::kI32), slots = ints({3, 0, 1}, DType::kI32);
  ops::NgramHash h;
  h.ngram_size = ngram, h.heads_per_ngram = per_ngram, h.eos = eos;
  std::vector<int64_t> mult, sizes, offsets;
  int64_t total = 0;
  for (int i = 0; i < ngram; ++i) mult.push_back(int64_t((0x9E3779B97F4A7C1ull * uint64_t(i + 3)) % (1ull << 40) | 1));
  for (int i = 0; i < heads; ++i) sizes.push_back(100003 + 2 * i * 7 + 1), offsets.push_back(total), total += sizes.back();
  h.multipliers = ints(mult, DType::kI64), h.sizes = ints(sizes, DType::kI64), h.offsets = ints(offsets, DType::kI64);
  ops::NgramHash dh = h;
  dh.multipliers = cuda::to_device(h.multipliers), dh.sizes = cuda::to_device(h.sizes), dh.offsets = cuda::to_device(h.offsets);
  Tensor windows = Tensor::empty({4, ngram - 1}, DType::kF32);
  for (int j = 0; j < ngram - 1; ++j) windows.ptr<float>()[(1) * (ngram - 1) + j] = j == 0 ? 51.0f : 0.0f;  // one token back
  for (int j = 0; j < ngram - 1; ++j) windows.ptr<float>()[(3) * (ngram - 1) + j] = float(10 + j);
  Tensor dwin = cuda::to_device(windows);
  Tensor rows = Tensor::empty({int64_t(tokens.size()), heads}, DType::kI32);
  Tensor drows = Tensor::empty(rows.shape(), DType::kI32, Device::kCUDA);
  ops::cpu::ngram_rows(ids, h, windows, starts, slots, rows);
  ops::ngram_rows(cuda::to_device(ids), dh, dwin, cuda::to_device(starts), cuda::to_device(slots), drows);
  report("ngram_rows n" + std::to_string(ngram) + " x" + std::to_string(per_ngram) + " (mismatches)",
         float(mismatches(cuda::to_host(drows), rows)) + max_abs_diff(cuda::to_host(dwin), windows), 0.0f);
}

void test_token_rows_write(int64_t T, int64_t W) {
  Tensor x = random_tensor({T, W}), cache = random_tensor({4, 16, W});
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < T; ++t) slots.push_back(t == 1 ? -1 : (t * 7) % 64);
  Tensor sl = ints(slots, DType::kI32), ref = host_copy(cache), dc = cuda::to_device(cache);
  ops::cpu::token_rows_write(x, sl, ref);
  ops::token_rows_write(cuda::to_device(x), cuda::to_device(sl), dc);
  report("token_rows_write T" + std::to_string(T) + " W" + std::to_string(W), max_abs_diff(cuda::to_host(dc), ref), 0.0f);
}

// QSA over a ragged batch: the indexer's block choice (a tie made by two blocks with equal raw
// keys), then the sparse attention on the CPU's choice, float32 and float16 caches, with the gate.
// graph: a decode batch as a recorded step hands it (the runner's device metadata, bounded by a
// max_model_len of 4096), which the kernels read instead of uploading the host arrays.
void test_qsa(std::vector<std::pair<int, int>> seqs, int heads, int D, int ratio, int top, int H, int KVH, int HD,
              bool graph = false) {
  TestBatch tb(seqs, 16);
  if (graph) tb.on_device(4096);
  const int T = tb.T;
  const ops::AttentionBatch& b = tb.b;
  Tensor q = random_tensor({T, heads, D}), rows = random_tensor({tb.total_blocks, 16, D}), norm = random_tensor({D});
  // Sequence 0's blocks 1 and 3 pool the same keys, zero where RoPE turns them (its rotary
  // features), so the keys stay equal and their scores tie for every query.
  auto [hrope, drope] = rope_tables(HD, 0.25, 4096);
  const int32_t* table = tb.tables.data();
  for (int j = 0; j < ratio && 4 * ratio <= tb.lens[0]; ++j) {
    float* a = rows.ptr<float>() + (int64_t(table[(ratio + j) / 16]) * 16 + (ratio + j) % 16) * D;
    float* c = rows.ptr<float>() + (int64_t(table[(3 * ratio + j) / 16]) * 16 + (3 * ratio + j) % 16) * D;
    std::fill(a, a + hrope.rotary_dim, 0.0f);
    std::memcpy(c, a, size_t(D) * 4);
  }
  const ops::QsaIndex hi{&norm, &hrope, 1e-6f, ratio};
  Tensor dnorm = cuda::to_device(norm);
  const ops::QsaIndex di{&dnorm, &drope, 1e-6f, ratio};
  Tensor blocks = Tensor::empty({T, top}, DType::kI32), dblocks = Tensor::empty({T, top}, DType::kI32, Device::kCUDA);
  ops::cpu::qsa_select(q, rows, hi, b, blocks);
  ops::qsa_select(cuda::to_device(q), cuda::to_device(rows), di, b, dblocks);
  const std::string tag = std::to_string(seqs.size()) + " seqs " + std::to_string(T) + " tokens r" + std::to_string(ratio) +
                          " top" + std::to_string(top) + (graph ? " graph" : "");
  report("qsa_select " + tag + " (mismatches)", float(mismatches(cuda::to_host(dblocks), blocks)), 0.0f);

  Tensor aq = random_tensor({T, H, HD}), gate = random_tensor({T, H * HD + 9}, DType::kF32, 2.0f);
  Tensor dgate = cuda::to_device(gate), dblk = cuda::to_device(blocks);
  const ops::OutputGate hg{&gate, 9}, dg{&dgate, 9};
  const float scale = 1.0f / std::sqrt(float(HD));
  for (DType kv : {DType::kF32, DType::kF16}) {
    auto [kc, dk] = random_cache(tb.total_blocks, 16, KVH, HD, kv);
    auto [vc, dv] = random_cache(tb.total_blocks, 16, KVH, HD, kv);
    for (bool gated : {false, true}) {
      Tensor ref = Tensor::empty({T, H, HD}, DType::kF32), dout = Tensor::empty({T, H, HD}, DType::kF32, Device::kCUDA);
      ops::cpu::qsa_attention(aq, kc, vc, b, blocks, ratio, scale, ref, gated ? &hg : nullptr, nullptr);
      ops::qsa_attention(cuda::to_device(aq), dk, dv, b, dblk, ratio, scale, dout, gated ? &dg : nullptr, nullptr);
      report("qsa_attention " + tag + " H" + std::to_string(H) + "/KV" + std::to_string(KVH) + " D" + std::to_string(HD) +
                 " " + dtype_name(kv) + (gated ? " gated" : ""),
             max_abs_diff(cuda::to_host(dout), ref), 1e-4f);
    }
  }
}

}  // namespace

void run_flash_next_cases() {
  test_hyper_connections(5, 4, 2048, 320);  // Flash-Next's widths (an assumption: hidden 2048, rank 320)
  test_hyper_connections(3, 2, 64, 8);
  test_hyper_connections(1, 3, 1000, 7);    // a group of no whole warp
  test_ngram_rows(3, 8);
  test_ngram_rows(5, 2);
  test_token_rows_write(9, 128);
  test_qsa({{300, 1}, {40, 1}, {0, 70}, {17, 5}}, 16, 128, 4, 8, 16, 2, 256);  // decode, prefill, chunks
  test_qsa({{3000, 1}, {2, 3}}, 4, 64, 8, 300, 8, 2, 128);  // a budget past the visible blocks
  test_qsa({{300, 1}, {40, 1}, {4000, 1}, {3, 1}, {0, 1}}, 16, 128, 4, 8, 16, 2, 256, true);
}

}  // namespace revolta::harness
