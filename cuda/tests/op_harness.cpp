// The GPU op harness: every CUDA op against its CPU implementation on random cases (shapes that
// cross block and warp edges), with a tolerance per case. `--perf` also times each case and prints
// the achieved bandwidth; `--perf=TEXT` times only the cases whose name contains TEXT. Prints
// "N passed, M failed"; exits non-zero on any failure.
//
// A C++ executable (not Python) so that the SM70-lane build can run it on a GPU machine as is.
// Shared helpers: harness.h; the quantized KV cache's cases: kv_quant_cases.cpp; batched piece copies:
// transfer_cases.cpp.
#include "harness.h"

using namespace revolta;
using namespace revolta::harness;

namespace {

void test_rms_norm(int64_t rows, int64_t n) {
  Tensor x = random_tensor({rows, n}), w = random_tensor({n}), res = random_tensor({rows, n});
  Tensor ref = Tensor::empty({rows, n}, DType::kF32);
  ops::cpu::rms_norm(x, w, 1e-6f, ref);
  Tensor dx = cuda::to_device(x), dw = cuda::to_device(w), dout = Tensor::empty({rows, n}, DType::kF32, Device::kCUDA);
  ops::rms_norm(dx, dw, 1e-6f, dout);
  const std::string tag = std::to_string(rows) + "x" + std::to_string(n);
  report("rms_norm " + tag, max_abs_diff(cuda::to_host(dout), ref), 1e-4f);
  perf("rms_norm " + tag, double(rows * n * 8), [&] { ops::rms_norm(dx, dw, 1e-6f, dout); });

  Tensor res_ref = Tensor::empty({rows, n}, DType::kF32);
  std::memcpy(res_ref.data(), res.data(), res.nbytes());
  ops::cpu::add_rms_norm(res_ref, x, w, 1e-6f, ref);
  Tensor dres = cuda::to_device(res);
  ops::add_rms_norm(dres, dx, dw, 1e-6f, dout);
  report("add_rms_norm " + tag, std::max(max_abs_diff(cuda::to_host(dout), ref), max_abs_diff(cuda::to_host(dres), res_ref)), 1e-4f);
}

void test_silu_mul(int64_t rows, int64_t I) {
  Tensor gu = random_tensor({rows, 2 * I}, DType::kF32, 3.0f), ref = Tensor::empty({rows, I}, DType::kF32);
  ops::cpu::silu_mul(gu, ref);
  Tensor dgu = cuda::to_device(gu), dout = Tensor::empty({rows, I}, DType::kF32, Device::kCUDA);
  ops::silu_mul(dgu, dout);
  const std::string tag = std::to_string(rows) + "x" + std::to_string(I);
  report("silu_mul " + tag, max_abs_diff(cuda::to_host(dout), ref), 1e-4f);
  perf("silu_mul " + tag, double(rows * I * 12), [&] { ops::silu_mul(dgu, dout); });
}

void test_embedding(int64_t vocab, int64_t hidden, int64_t T, DType dt) {
  Tensor table = random_tensor({vocab, hidden}, dt);
  Tensor ids = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) ids.ptr<int32_t>()[i] = int32_t((i * 7919) % vocab);
  Tensor ref = Tensor::empty({T, hidden}, DType::kF32);
  ops::cpu::embedding(ids, table, ref, nullptr);
  Tensor dout = Tensor::empty({T, hidden}, DType::kF32, Device::kCUDA);
  Tensor dids = cuda::to_device(ids), dtab = cuda::to_device(table);
  ops::embedding(dids, dtab, dout);
  const std::string tag = std::string(dtype_name(dt)) + " " + std::to_string(T) + "x" + std::to_string(hidden);
  report("embedding " + tag, max_abs_diff(cuda::to_host(dout), ref), 0.0f);
  // with the first block's input norm (a fixed weight: the random stream of later cases stays as it was)
  Tensor w = Tensor::empty({hidden}, DType::kF32), normed = Tensor::empty({T, hidden}, DType::kF32);
  for (int64_t i = 0; i < hidden; ++i) w.ptr<float>()[i] = 0.5f + 0.1f * float(i % 7);
  const ops::NormInto hn{&w, 1e-6f, &normed};
  ops::cpu::embedding(ids, table, ref, &hn);
  Tensor dw = cuda::to_device(w), dnormed = Tensor::empty({T, hidden}, DType::kF32, Device::kCUDA);
  const ops::NormInto dn{&dw, 1e-6f, &dnormed};
  ops::embedding(dids, dtab, dout, &dn);
  report("embedding + norm " + tag,
         std::max(max_abs_diff(cuda::to_host(dout), ref), max_abs_diff(cuda::to_host(dnormed), normed)), 1e-4f);
  // A vocabulary-parallel rank's slice (the middle third): its rows, zeros for the other ids.
  const int64_t first = vocab / 3, rows = vocab / 3;
  Tensor part = table.slice_rows(first, first + rows);  // a view of whole rows: contiguous
  Tensor ref_shard = Tensor::empty({T, hidden}, DType::kF32);
  ops::cpu::embedding_shard(ids, part, first, ref_shard);
  ops::embedding_shard(dids, cuda::to_device(part), first, dout);
  report("embedding_shard " + tag, max_abs_diff(cuda::to_host(dout), ref_shard), 0.0f);
}

void test_rope(int64_t T, int64_t heads, int64_t D, double partial, const char* type) {
  RopeConfig rc;
  rc.type = type;
  rc.factor = 4.0;
  rc.original_max_position_embeddings = 256;
  const auto tables = rope_tables(D, partial, 4096, rc);
  const ops::RopeTables &host_tables = tables.first, &dev_tables = tables.second;
  Tensor x = random_tensor({T, heads, D}), pos = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) pos.ptr<int32_t>()[i] = int32_t((i * 131) % 4096);
  Tensor dx = cuda::to_device(x), dpos = cuda::to_device(pos);
  ops::cpu::rope(x, pos, host_tables);
  ops::rope(dx, dpos, dev_tables);
  report(std::string("rope ") + type + " " + std::to_string(T) + "x" + std::to_string(heads) + "x" + std::to_string(D) +
             " rot " + std::to_string(dev_tables.rotary_dim),
         max_abs_diff(cuda::to_host(dx), x), 1e-5f);
}

void test_kv_cache_write(int64_t T, int64_t blocks, int64_t bs, int64_t kvh, int64_t D) {
  Tensor k = random_tensor({T, kvh, D}), v = random_tensor({T, kvh, D}), slots = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) slots.ptr<int32_t>()[i] = int32_t((i * 37 + 5) % (blocks * bs));  // distinct for T <= blocks*bs/gcd
  Tensor kc = random_tensor({blocks, bs, kvh, D}), vc = random_tensor({blocks, bs, kvh, D});
  Tensor dkc = cuda::to_device(kc), dvc = cuda::to_device(vc);
  ops::cpu::kv_cache_write(k, v, slots, kc, vc, nullptr);
  ops::kv_cache_write(cuda::to_device(k), cuda::to_device(v), cuda::to_device(slots), dkc, dvc);
  report("kv_cache_write " + std::to_string(T) + " tokens", std::max(max_abs_diff(cuda::to_host(dkc), kc), max_abs_diff(cuda::to_host(dvc), vc)), 0.0f);
}

void test_linear(int64_t M, int64_t N, int64_t K, DType dt, bool with_bias) {
  Tensor x = random_tensor({M, K}), w = random_tensor({N, K}, dt, 0.05f), bias = random_tensor({N});
  Tensor ref = Tensor::empty({M, N}, DType::kF32);
  ops::cpu::linear(x, w, with_bias ? &bias : nullptr, ref);
  Tensor dx = cuda::to_device(x), dw = cuda::to_device(w), db = cuda::to_device(bias);
  Tensor dout = Tensor::empty({M, N}, DType::kF32, Device::kCUDA);
  ops::linear(dx, dw, with_bias ? &db : nullptr, dout);
  const std::string tag = std::string(dtype_name(dt)) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                          std::to_string(K) + (with_bias ? " +bias" : "");
  // Tensor-core tiles (f16 weights, M > 8, or from 6 rows with N % 16 == 0 and K % 128 == 0; 4-bit
  // weights past 64 rows, dequantized to f16) round x to f16 as they stage it: a wider tolerance.
  const bool tensor_cores = (dt == DType::kF16 && ((M > 8 && K % 8 == 0) || (M >= 6 && N % 16 == 0 && K % 128 == 0))) ||
                            (is_block_dtype(dt) && M > 64);
  const float tol = tensor_cores ? 4e-4f * std::sqrt(float(K)) : 2e-4f * std::sqrt(float(K)) / 8.0f + 1e-4f;
  report("linear " + tag, max_abs_diff(cuda::to_host(dout), ref), tol);
  // As in a decode step: x written by the kernel right before (an RMSNorm), nothing between them,
  // so a load of x made before the linear kernel's wait would read the zeros it was allocated with.
  Tensor nw = random_tensor({K}), xn = Tensor::empty({M, K}, DType::kF32), ref_n = Tensor::empty({M, N}, DType::kF32);
  ops::cpu::rms_norm(x, nw, 1e-6f, xn);
  ops::cpu::linear(xn, w, with_bias ? &bias : nullptr, ref_n);
  Tensor dnw = cuda::to_device(nw), dxn = Tensor::empty({M, K}, DType::kF32, Device::kCUDA);
  Tensor dout_n = Tensor::empty({M, N}, DType::kF32, Device::kCUDA);
  ops::rms_norm(dx, dnw, 1e-6f, dxn);
  ops::linear(dxn, dw, with_bias ? &db : nullptr, dout_n);
  report("linear after rms_norm " + tag, max_abs_diff(cuda::to_host(dout_n), ref_n), tol);
  perf("linear " + tag, double(dtype_bytes(dt, N * K)) + double(M * K + M * N) * 4,
       [&] { ops::linear(dx, dw, with_bias ? &db : nullptr, dout); }, 2.0 * double(M) * double(N) * double(K));
}

void test_paged_attention(std::vector<std::pair<int, int>> seqs /* (cached, new) */, int H, int KVH, int D, int bs,
                          DType kv_dtype = DType::kF32, bool device_metadata = false, int graph_max_len = 0,
                          bool gated = false) {
  TestBatch tb(seqs, bs);
  const int T = tb.T;
  const bool all_decode = tb.all_decode;
  ops::AttentionBatch& b = tb.b;
  Tensor q = random_tensor({T, H, D});
  auto [kc, dk] = random_cache(tb.total_blocks, bs, KVH, D, kv_dtype);
  auto [vc, dv] = random_cache(tb.total_blocks, bs, KVH, D, kv_dtype);
  Tensor ref = Tensor::empty({T, H, D}, DType::kF32);
  const float scale = 1.0f / std::sqrt(float(D));
  // gated: the output gate in columns [7, 7 + H * D) of a wider tensor, as in a fused projection
  Tensor gate = gated ? random_tensor({T, H * D + 11}, DType::kF32, 2.0f) : Tensor();
  Tensor dgate = gated ? cuda::to_device(gate) : Tensor();
  const ops::OutputGate hg{&gate, 7}, dg{&dgate, 7};
  ops::cpu::paged_attention(q, kc, vc, b, scale, ref, gated ? &hg : nullptr, nullptr);
  Tensor dq = cuda::to_device(q);
  if (device_metadata) tb.on_device(graph_max_len);
  Tensor dout = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA);
  ops::paged_attention(dq, dk, dv, b, scale, dout, gated ? &dg : nullptr);
  int64_t kv_bytes = 0;
  double flops = 0;
  for (auto [cached, fresh] : seqs) {
    kv_bytes += int64_t(cached + fresh) * KVH * D * int64_t(dtype_size(kv_dtype)) * 2;
    flops += 4.0 * H * D * double(fresh) * (cached + (fresh + 1) / 2.0);
  }
  const std::string tag = std::to_string(seqs.size()) + " seqs " + std::to_string(T) + " tokens H" + std::to_string(H) + "/KV" +
                          std::to_string(KVH) + " D" + std::to_string(D) + " " + dtype_name(kv_dtype) +
                          (device_metadata ? (all_decode ? " dev-meta decode" : " dev-meta") : "") + (gated ? " gated" : "");
  perf("paged_attention " + tag, double(kv_bytes), [&] { ops::paged_attention(dq, dk, dv, b, scale, dout, gated ? &dg : nullptr); }, flops);
  // Multi-token sequences with head_dim 64/128/256 run on tensor cores (Q and P rounded to f16).
  const bool tensor_cores = !all_decode && (D == 64 || D == 128 || D == 256);
  report("paged_attention " + tag, max_abs_diff(cuda::to_host(dout), ref), tensor_cores ? 2e-2f : 1e-4f);
}

// qkv_rope_attention against the CPU's (qkv_rope_cache, then paged_attention): q, both caches
// whole and the output. graph: device metadata, the decode graph's form (one kernel when every
// sequence decodes); `padding` appends a padding row (slot -1, a context of one, as the runner
// pads a graph's batch), whose output is not compared (the op leaves it unspecified).
void test_qkv_rope_attention(std::vector<std::pair<int, int>> seqs, int H, int KVH, int D, double partial, bool qk_norm,
                             DType kv_dtype, bool graph, bool padding = false) {
  const int bs = 16;
  if (padding) seqs.push_back({0, 1});
  TestBatch tb(seqs, bs);
  const int T = tb.T;
  const auto tables = rope_tables(D, partial, 8192);
  const ops::RopeTables &host_tables = tables.first, &dev_tables = tables.second;
  // The fused projection [q | k | v | output gate] (Qwen3-Next's layout; a dense model's has no gate).
  const bool gated = partial < 1.0;
  Tensor qkv = random_tensor({T, (H + 2 * KVH) * D + (gated ? H * D : 0)});
  Tensor pos = Tensor::empty({T}, DType::kI32), slots = Tensor::empty({T}, DType::kI32);
  for (int t = 0; t < T; ++t) {
    pos.ptr<int32_t>()[t] = tb.position(t);
    slots.ptr<int32_t>()[t] = padding && t == T - 1 ? -1 : tb.slot(t);
  }
  Tensor qn = random_tensor({D}), kn = random_tensor({D}), dqn = cuda::to_device(qn), dkn = cuda::to_device(kn);
  ops::QkNorm host_norm, dev_norm;
  if (qk_norm) host_norm = {&qn, &kn, 1e-6f}, dev_norm = {&dqn, &dkn, 1e-6f};
  auto [kc, dk] = random_cache(tb.total_blocks, bs, KVH, D, kv_dtype);
  auto [vc, dv] = random_cache(tb.total_blocks, bs, KVH, D, kv_dtype);
  const float scale = 1.0f / std::sqrt(float(D));
  const ops::OutputGate hg{&qkv, (H + 2 * KVH) * D};
  Tensor q = Tensor::empty({T, H, D}, DType::kF32), out = Tensor::empty({T, H, D}, DType::kF32);
  if (kv_dtype == DType::kF32) {
    ops::cpu::qkv_rope_attention(qkv, host_norm, pos, host_tables, slots, q, kc, vc, tb.b, scale, out, gated ? &hg : nullptr,
                                   nullptr);
  } else {  // the CPU's cache is f32: its pair, with the slots written rounded as an f16 cache holds them
    ops::cpu::qkv_rope_cache(qkv, host_norm, pos, host_tables, slots, q, kc, vc, nullptr);
    for (Tensor* c : {&kc, &vc}) {
      Tensor r = Tensor::empty(c->shape(), kv_dtype);
      convert_from_f32(c->ptr<float>(), r.data(), kv_dtype, size_t(c->numel()));
      convert_to_f32(r.data(), kv_dtype, c->ptr<float>(), size_t(c->numel()));
    }
    ops::cpu::paged_attention(q, kc, vc, tb.b, scale, out, gated ? &hg : nullptr, nullptr);
  }
  if (graph) tb.on_device(4096);
  Tensor dqkv = cuda::to_device(qkv), dpos = cuda::to_device(pos), dslots = cuda::to_device(slots);
  const ops::OutputGate dg{&dqkv, (H + 2 * KVH) * D};
  Tensor dq = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA), dout = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA);
  auto run = [&] {
    ops::qkv_rope_attention(dqkv, dev_norm, dpos, dev_tables, dslots, dq, dk, dv, tb.b, scale, dout, gated ? &dg : nullptr);
  };
  run();
  const int compared = padding ? T - 1 : T;  // rows of real tokens
  auto rows = [&](const Tensor& t) { return t.slice_rows(0, compared); };
  const float err = std::max(max_abs_diff(rows(cuda::to_host(dq)), rows(q)), max_abs_diff(rows(cuda::to_host(dout)), rows(out)));
  const float cache_err = std::max(max_abs_diff(host_f32(dk), kc), max_abs_diff(host_f32(dv), vc));
  const bool f16 = kv_dtype == DType::kF16;  // a value near an f16 rounding boundary may round either way
  // A multi-token sequence's rows go through the tensor-core tiles (Q and P rounded to f16).
  const bool tiles = std::any_of(seqs.begin(), seqs.end(), [](const auto& sq) { return sq.second > 1; }) &&
                     (D == 64 || D == 128 || D == 256);
  std::string tag = std::to_string(seqs.size()) + " seqs " + std::to_string(T) + " tokens H" + std::to_string(H) + "/KV" +
                    std::to_string(KVH) + " D" + std::to_string(D) + (partial < 1.0 ? " partial" : "") +
                    (qk_norm ? " qk-norm " : " ") + dtype_name(kv_dtype) + (graph ? " graph" : "") + (padding ? " +pad" : "");
  perf("qkv_rope_attention " + tag, double(qkv.nbytes()), run);
  report("qkv_rope_attention " + tag, err, tiles ? 2e-2f : f16 ? 2e-3f : 1e-4f);
  report("qkv_rope_attention cache " + tag, cache_err, f16 ? 4e-3f : 1e-5f);
}

void test_data_movement() {
  Tensor x = random_tensor({37, 300}), rows = Tensor::empty({5}, DType::kI32);
  const int32_t picks[5] = {36, 0, 7, 7, 20};
  std::copy(picks, picks + 5, rows.ptr<int32_t>());
  Tensor ref = Tensor::empty({5, 300}, DType::kF32), dout = Tensor::empty({5, 300}, DType::kF32, Device::kCUDA);
  ops::cpu::gather_rows(x, rows, ref);
  ops::gather_rows(cuda::to_device(x), cuda::to_device(rows), dout);
  report("gather_rows 5 of 37x300", max_abs_diff(cuda::to_host(dout), ref), 0.0f);

  Tensor cref = Tensor::empty({37, 70}, DType::kF32), cdev = Tensor::empty({37, 70}, DType::kF32, Device::kCUDA);
  ops::cpu::copy_columns(x, 130, cref);
  ops::copy_columns(cuda::to_device(x), 130, cdev);
  report("copy_columns 130..200 of 37x300", max_abs_diff(cuda::to_host(cdev), cref), 0.0f);

  for (DType dt : {DType::kF32, DType::kF16}) {  // sizes that end inside the 32 x 32 tiles
    const int64_t R = 45, C = 70;
    Tensor h = random_tensor({R, C}, dt), ht = Tensor::empty({C, R}, dt), dt_out = Tensor::empty({C, R}, dt, Device::kCUDA);
    ops::cpu::transpose(h, ht);
    ops::transpose(cuda::to_device(h), dt_out);
    const Tensor got = cuda::to_host(dt_out);
    const size_t es = dtype_size(dt);
    const char *src = static_cast<const char*>(h.data()), *cpu = static_cast<const char*>(ht.data()),
               *gpu = static_cast<const char*>(got.data());
    int64_t wrong = 0;  // element by element against out[c, r] = x[r, c]
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const char* want = src + size_t(r * C + c) * es;
        wrong += std::memcmp(cpu + size_t(c * R + r) * es, want, es) != 0;
        wrong += std::memcmp(gpu + size_t(c * R + r) * es, want, es) != 0;
      }
    report(std::string("transpose 45x70 ") + dtype_name(dt), float(wrong), 0.0f);
  }

  for (DType dt : {DType::kF32, DType::kF16}) {
    Tensor h = Tensor::empty({1000, 77}, dt), d = Tensor::empty({1000, 77}, dt, Device::kCUDA);
    ops::cpu::fill_uniform(h, 42, -0.5f, 0.25f, {});
    ops::fill_uniform(d, 42, -0.5f, 0.25f);
    Tensor a = Tensor::empty(h.shape(), DType::kF32), c = Tensor::empty(h.shape(), DType::kF32);
    convert_to_f32(h.data(), dt, a.ptr<float>(), size_t(h.numel()));
    convert_to_f32(cuda::to_host(d).data(), dt, c.ptr<float>(), size_t(h.numel()));
    float lo = 1e9f, hi = -1e9f;
    for (int64_t i = 0; i < a.numel(); ++i) lo = std::min(lo, a.ptr<float>()[i]), hi = std::max(hi, a.ptr<float>()[i]);
    const bool in_range = lo >= -0.5f && hi <= 0.25f && hi - lo > 0.7f;  // spans the interval
    report(std::string("fill_uniform ") + dtype_name(dt) + " (same values as the CPU)",
           in_range ? max_abs_diff(a, c) : 1.0f, 0.0f);
    // A window (a tensor-parallel rank's slice of a made-up weight): rows 100..399, columns 10..49.
    Tensor w = Tensor::empty({300, 40}, dt, Device::kCUDA);
    ops::fill_uniform(w, 42, -0.5f, 0.25f, ops::FillWindow{100, 10, 77});
    const Tensor hw = cuda::to_host(w);
    int64_t wrong = 0;
    const size_t es = dtype_size(dt);
    for (int64_t r = 0; r < 300; ++r)
      wrong += std::memcmp(static_cast<const char*>(hw.data()) + size_t(r * 40) * es,
                           static_cast<const char*>(h.data()) + size_t((100 + r) * 77 + 10) * es, 40 * es) != 0;
    report(std::string("fill_uniform window ") + dtype_name(dt) + " (the whole's values there)", float(wrong), 0.0f);
  }
}

void test_qkv_rope_cache(int64_t T, int64_t H, int64_t KVH, int64_t D, double partial, bool qk_norm, DType kv_dtype) {
  const auto tables = rope_tables(D, partial, 2048);
  const ops::RopeTables &host_tables = tables.first, &dev_tables = tables.second;
  const int64_t blocks = 8, bs = 16;
  // Qwen3-Next's projection (the partial-rotary case) carries its output gate after v: wider rows.
  const int64_t gate_columns = partial < 1.0 ? H * D : 0;
  Tensor qkv = random_tensor({T, (H + 2 * KVH) * D + gate_columns}), pos = Tensor::empty({T}, DType::kI32), slots = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) {
    pos.ptr<int32_t>()[i] = int32_t((i * 97) % 2048);
    slots.ptr<int32_t>()[i] = i == 1 ? -1 : int32_t((i * 37 + 5) % (blocks * bs));  // row 1 is padding
  }
  Tensor qn = random_tensor({D}), kn = random_tensor({D});
  ops::QkNorm host_norm, dev_norm;
  Tensor dqn = cuda::to_device(qn), dkn = cuda::to_device(kn);
  if (qk_norm) host_norm = {&qn, &kn, 1e-6f}, dev_norm = {&dqn, &dkn, 1e-6f};
  Tensor kc = Tensor::empty({blocks, bs, KVH, D}, DType::kF32), vc = Tensor::empty({blocks, bs, KVH, D}, DType::kF32);
  Tensor q = Tensor::empty({T, H, D}, DType::kF32);
  ops::cpu::qkv_rope_cache(qkv, host_norm, pos, host_tables, slots, q, kc, vc, nullptr);
  Tensor dq = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA);
  Tensor dkc = Tensor::empty({blocks, bs, KVH, D}, kv_dtype, Device::kCUDA), dvc = Tensor::empty({blocks, bs, KVH, D}, kv_dtype, Device::kCUDA);
  ops::qkv_rope_cache(cuda::to_device(qkv), dev_norm, cuda::to_device(pos), dev_tables, cuda::to_device(slots), dq, dkc, dvc);
  auto as_f32 = [](const Tensor& t) {
    Tensor h = cuda::to_host(t), f = Tensor::empty(h.shape(), DType::kF32);
    convert_to_f32(h.data(), h.dtype(), f.ptr<float>(), size_t(h.numel()));
    return f;
  };
  const float tol = kv_dtype == DType::kF16 ? 4e-3f : 1e-5f;  // f16 cache: its rounding
  const float err = std::max({max_abs_diff(cuda::to_host(dq), q), max_abs_diff(as_f32(dkc), kc), max_abs_diff(as_f32(dvc), vc)});
  report("qkv_rope_cache T" + std::to_string(T) + " H" + std::to_string(H) + "/KV" + std::to_string(KVH) + " D" +
             std::to_string(D) + (partial < 1.0 ? " partial" : "") + (qk_norm ? " qk-norm " : " ") + dtype_name(kv_dtype),
         err, tol);
}

// Device sampling against the CPU op at the same uniforms: tokens (a rare flip where float and
// double sums straddle a boundary is tolerated: at most 1 row in 16), logprobs, top alternatives.
void test_sample(int64_t V, ops::SampleRow base, const std::string& name) {
  const int64_t R = 48;
  Tensor logits = random_tensor({R, V}, DType::kF32, 3.0f);
  std::vector<ops::SampleRow> rows;
  std::vector<ops::SampleAdjust> adjust;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (int64_t r = 0; r < R; ++r) {
    ops::SampleRow row = base;
    row.uniform = ud(g_rng);
    row.adjust_begin = int32_t(adjust.size());
    for (int j = 0; j < 6; ++j) {  // penalised / masked tokens, the row's best among them
      ops::SampleAdjust a;
      a.token = int32_t((r * 131 + j * 977) % V);
      a.masked = j == 0;
      a.seen = 1;
      a.out_count = j % 3;
      a.bias = j == 5 ? 4.0f : j == 4 ? -2.5f : 0.0f;
      adjust.push_back(a);
    }
    row.adjust_end = int32_t(adjust.size());
    rows.push_back(row);
  }
  std::vector<ops::SampleResult> ref, got;
  ops::cpu::sample(logits, rows, adjust, ref);
  Tensor dl = cuda::to_device(logits);
  ops::sample(dl, rows, adjust, got);
  int flips = 0;
  float lp_err = 0.0f;
  for (int64_t r = 0; r < R; ++r) {
    flips += got[size_t(r)].token != ref[size_t(r)].token;
    if (base.num_logprobs >= 0 && got[size_t(r)].token == ref[size_t(r)].token) {
      lp_err = std::max(lp_err, std::fabs(got[size_t(r)].logprob - ref[size_t(r)].logprob));
      for (int j = 0; j < base.num_logprobs; ++j) {
        if (got[size_t(r)].top_ids[j] != ref[size_t(r)].top_ids[j]) lp_err = 1.0f;
        lp_err = std::max(lp_err, std::fabs(got[size_t(r)].top_logprobs[j] - ref[size_t(r)].top_logprobs[j]));
      }
    }
  }
  report("sample " + name + " " + std::to_string(R) + "x" + std::to_string(V) + " token flips", float(flips), float(R / 16));
  if (base.num_logprobs >= 0) report("sample " + name + " logprobs", lp_err, 1e-3f);
  perf("sample " + name + " " + std::to_string(R) + " rows", double(R * V * 4), [&] { ops::sample(dl, rows, adjust, got); });
}

void test_linear_swiglu(int64_t M, int64_t I, int64_t K) {
  Tensor x = random_tensor({M, K}), w = random_tensor({2 * I, K}, DType::kF16, 0.05f);
  Tensor ref = Tensor::empty({M, I}, DType::kF32);
  ops::cpu::linear_swiglu(x, w, ref);
  Tensor dx = cuda::to_device(x), dw = cuda::to_device(w), dout = Tensor::empty({M, I}, DType::kF32, Device::kCUDA);
  ops::linear_swiglu(dx, dw, dout);
  const std::string tag = std::to_string(M) + "x" + std::to_string(I) + "x" + std::to_string(K);
  const bool tensor_cores = M > 8 || (M >= 6 && K % 128 == 0 && I % 8 == 0);  // the split-K fragments from 6 rows
  const float tol = tensor_cores ? 4e-4f * std::sqrt(float(K)) : 4e-4f * std::sqrt(float(K)) / 8.0f + 1e-4f;
  report("linear_swiglu " + tag, max_abs_diff(cuda::to_host(dout), ref), tol);
  perf("linear_swiglu " + tag, double(2 * I * K * 2 + M * K * 4 + M * I * 4), [&] { ops::linear_swiglu(dx, dw, dout); });
}

// The delta rule over a batch of sequences (lengths `lens`, state slots in reverse order): q and k
// L2-normalised and the gates in range as the model makes them (decay exp(g) in (0, 1), beta in
// (0, 1)); states random. Checked against the CPU recurrent form and its chunked form.
void test_gated_delta_rule(std::vector<int32_t> lens, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv) {
  const int64_t S = int64_t(lens.size()), slots = S + 2;
  Tensor starts = Tensor::empty({S + 1}, DType::kI32), sl = Tensor::empty({S}, DType::kI32);
  for (int64_t i = 0; i < S; ++i) {
    starts.ptr<int32_t>()[i + 1] = starts.ptr<int32_t>()[i] + lens[size_t(i)];
    sl.ptr<int32_t>()[i] = int32_t(slots - 1 - i);
  }
  const int64_t T = starts.ptr<int32_t>()[S];
  Tensor q = random_tensor({T, Hk, Dk}), k = random_tensor({T, Hk, Dk}), v = random_tensor({T, Hv, Dv});
  ops::cpu::l2_norm(q, Dk, 1e-6f);
  ops::cpu::l2_norm(k, Dk, 1e-6f);
  Tensor g = Tensor::empty({T, Hv}, DType::kF32), beta = Tensor::empty({T, Hv}, DType::kF32);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (int64_t i = 0; i < T * Hv; ++i) g.ptr<float>()[i] = -ud(g_rng), beta.ptr<float>()[i] = ud(g_rng);
  Tensor s0 = random_tensor({slots, Hv, Dk, Dv}, DType::kF32, 0.1f);
  Tensor s_ref = Tensor::empty(s0.shape(), DType::kF32), s_chunk = Tensor::empty(s0.shape(), DType::kF32);
  std::memcpy(s_ref.data(), s0.data(), s0.nbytes());
  std::memcpy(s_chunk.data(), s0.data(), s0.nbytes());
  Tensor ref = Tensor::empty({T, Hv, Dv}, DType::kF32), ref_chunk = Tensor::empty({T, Hv, Dv}, DType::kF32);
  ops::cpu::gated_delta_rule(q, k, v, g, beta, s_ref, starts, sl, ref, 0);
  ops::cpu::gated_delta_rule(q, k, v, g, beta, s_chunk, starts, sl, ref_chunk, 64);
  Tensor ds = cuda::to_device(s0), dout = Tensor::empty({T, Hv, Dv}, DType::kF32, Device::kCUDA);
  Tensor dq = cuda::to_device(q), dk = cuda::to_device(k), dv = cuda::to_device(v), dg = cuda::to_device(g),
         db = cuda::to_device(beta), dst = cuda::to_device(starts), dsl = cuda::to_device(sl);
  ops::gated_delta_rule(dq, dk, dv, dg, db, ds, dst, dsl, dout, 64);
  Tensor out = cuda::to_host(dout), st = cuda::to_host(ds);
  std::string tag = std::to_string(S) + " seqs T" + std::to_string(T) + " Hk" + std::to_string(Hk) + "/Hv" +
                    std::to_string(Hv) + " Dk" + std::to_string(Dk) + " Dv" + std::to_string(Dv);
  // Past 64 tokens with Dk == Dv in {64, 128} the device runs the chunked tensor-core form, whose
  // operands are rounded to f16: its error is checked relative to the outputs' scale.
  const bool tensor_cores = T > 64 && Dk == Dv && (Dk == 64 || Dk == 128);
  const float tol = tensor_cores ? 4e-3f * std::max(max_abs(ref), max_abs(s_ref)) : 1e-4f;
  if (tensor_cores) tag += " chunked on tensor cores";
  report("gated_delta_rule " + tag + " vs recurrent", std::max(max_abs_diff(out, ref), max_abs_diff(st, s_ref)), tol);
  report("gated_delta_rule " + tag + " vs chunked", std::max(max_abs_diff(out, ref_chunk), max_abs_diff(st, s_chunk)),
         std::max(tol, 1e-3f));
  perf("gated_delta_rule " + tag, double(S * Hv * Dk * Dv * 8 + T * (2 * Hk * Dk + 2 * Hv * Dv) * 4),
       [&] { ops::gated_delta_rule(dq, dk, dv, dg, db, ds, dst, dsl, dout, 64); });
}

// A Qwen3-Next prefill of T tokens (one sequence, 32 value heads of 128): the chunked tensor-core
// form against the device's recurrent form on the same inputs, and both timed (--perf).
void test_gdn_prefill(int64_t T) {
  const int64_t Hk = 16, Hv = 32, D = 128;
  Tensor q = random_tensor({T, Hk, D}), k = random_tensor({T, Hk, D}), v = random_tensor({T, Hv, D});
  ops::cpu::l2_norm(q, D, 1e-6f);
  ops::cpu::l2_norm(k, D, 1e-6f);
  Tensor g = Tensor::empty({T, Hv}, DType::kF32), beta = Tensor::empty({T, Hv}, DType::kF32);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (int64_t i = 0; i < T * Hv; ++i) g.ptr<float>()[i] = -0.2f * ud(g_rng), beta.ptr<float>()[i] = ud(g_rng);
  Tensor starts = Tensor::empty({2}, DType::kI32), sl = Tensor::empty({1}, DType::kI32);
  starts.ptr<int32_t>()[1] = int32_t(T);
  Tensor dq = cuda::to_device(q), dk = cuda::to_device(k), dv = cuda::to_device(v), dg = cuda::to_device(g),
         db = cuda::to_device(beta), dst = cuda::to_device(starts), dsl = cuda::to_device(sl);
  Tensor s0 = random_tensor({1, Hv, D, D}, DType::kF32, 0.1f);
  Tensor ds_c = cuda::to_device(s0), ds_r = cuda::to_device(s0);
  Tensor oc = Tensor::empty({T, Hv, D}, DType::kF32, Device::kCUDA), orr = Tensor::empty({T, Hv, D}, DType::kF32, Device::kCUDA);
  ops::gated_delta_rule(dq, dk, dv, dg, db, ds_c, dst, dsl, oc, 64);
  ops::gated_delta_rule(dq, dk, dv, dg, db, ds_r, dst, dsl, orr, 0);
  const Tensor ref = cuda::to_host(orr), sref = cuda::to_host(ds_r);
  const std::string tag = "T" + std::to_string(T) + " Hv32 D128";
  report("gated_delta_rule prefill " + tag + " chunked vs recurrent",
         std::max(max_abs_diff(cuda::to_host(oc), ref), max_abs_diff(cuda::to_host(ds_c), sref)),
         4e-3f * std::max(max_abs(ref), max_abs(sref)));
  const double flops = double(T) * Hv * D * D * 2 * 4;
  perf("gdn prefill chunked " + tag, double(T * (2 * Hk + 2 * Hv) * D * 4), [&] { ops::gated_delta_rule(dq, dk, dv, dg, db, ds_c, dst, dsl, oc, 64); }, flops);
  perf("gdn prefill recurrent " + tag, double(T * (2 * Hk + 2 * Hv) * D * 4), [&] { ops::gated_delta_rule(dq, dk, dv, dg, db, ds_r, dst, dsl, orr, 0); }, flops);
}

// A DeltaNet block's decode step from its fused projection (gdn_decode) against the CPU's
// composition of the separate ops; sequences of `lens` tokens plus a padding row (slot -1). With a
// hidden size, the op starts from the block's input and its f16 projection (no padding row: a
// step of one token of one sequence takes the CUDA kernel that computes the projection itself).
// The output projection follows on the stream as in a decode step (nothing between them), so its
// loads of out must wait for gdn_decode under dependent launch. deferred: the gated norm's RMS left
// to the output projection (squares, then linear_scaled), on both backends, against the CPU's
// normed step and its projection.
void test_gdn_decode(std::vector<int32_t> lens, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t W,
                     int64_t hidden = 0, bool deferred = false) {
  const bool pad = hidden == 0;
  const int64_t S = int64_t(lens.size()) + (pad ? 1 : 0), slots = S + 1, C = 2 * Hk * Dk + Hv * Dv;
  const int64_t width = C + Hv * Dv + 2 * Hv + (pad ? 5 : 0);
  Tensor starts = Tensor::empty({S + 1}, DType::kI32), sl = Tensor::empty({S}, DType::kI32);
  for (int64_t i = 0; i < int64_t(lens.size()); ++i) {
    starts.ptr<int32_t>()[i + 1] = starts.ptr<int32_t>()[i] + lens[size_t(i)];
    sl.ptr<int32_t>()[i] = int32_t(slots - 1 - i);
  }
  if (pad) {
    starts.ptr<int32_t>()[S] = starts.ptr<int32_t>()[S - 1] + 1;  // the padding row
    sl.ptr<int32_t>()[S - 1] = -1;
  }
  const int64_t T = starts.ptr<int32_t>()[S];
  Tensor fused = random_tensor({T, width}, DType::kF32, 2.0f), conv = random_tensor({C, W}, DType::kF32, 0.5f);
  Tensor x = random_tensor({T, std::max<int64_t>(hidden, 1)}), proj = random_tensor({width, std::max<int64_t>(hidden, 1)}, DType::kF16, 0.04f);
  Tensor neg_a = random_tensor({Hv}), dtb = random_tensor({Hv}), nw = random_tensor({Dv});
  for (int64_t h = 0; h < Hv; ++h) neg_a.ptr<float>()[h] = -std::fabs(neg_a.ptr<float>()[h]) - 0.05f;
  Tensor cs = random_tensor({slots, C, W - 1}), ss = random_tensor({slots, Hv, Dk, Dv}, DType::kF32, 0.1f);
  Tensor dcs = cuda::to_device(cs), dss = cuda::to_device(ss);
  Tensor ref = Tensor::empty({T, Hv * Dv}, DType::kF32), dout = Tensor::empty({T, Hv * Dv}, DType::kF32, Device::kCUDA);
  const ops::GdnWeights hw{&proj, &conv, &neg_a, &dtb, &nw, 1e-6f};
  const Tensor cs0 = host_copy(cs), ss0 = host_copy(ss);  // (deferred's start)
  ops::cpu::gdn_decode(pad ? nullptr : &x, fused, hw, cs, ss, starts, sl, ref, nullptr);
  Tensor dconv = cuda::to_device(conv), dna = cuda::to_device(neg_a), ddt = cuda::to_device(dtb), dnw = cuda::to_device(nw);
  Tensor dproj = cuda::to_device(proj), dx = cuda::to_device(x);
  const ops::GdnWeights dw{&dproj, &dconv, &dna, &ddt, &dnw, 1e-6f};
  Tensor dfused = cuda::to_device(pad ? fused : random_tensor({T, width})), dst = cuda::to_device(starts), dsl = cuda::to_device(sl);
  const Tensor* dxp = pad ? nullptr : &dx;
  const int64_t parts = (Dv + 31) / 32;
  Tensor dsq = Tensor::empty({T, Hv, parts}, DType::kF32, Device::kCUDA);
  const Tensor ow = random_tensor({96, Hv * Dv}, DType::kF16, 0.04f), dow = cuda::to_device(ow);
  Tensor y_ref = Tensor::empty({T, 96}, DType::kF32), dy = Tensor::empty({T, 96}, DType::kF32, Device::kCUDA);
  ops::gdn_decode(dxp, dfused, dw, dcs, dss, dst, dsl, dout, deferred ? &dsq : nullptr);
  if (deferred) ops::linear_scaled(dout, ops::GroupScale{&dsq, 1e-6f}, dow, dy);
  else ops::linear(dout, dow, nullptr, dy);
  ops::cpu::linear(ref, ow, nullptr, y_ref);
  const std::string tag = std::to_string(S) + " seqs T" + std::to_string(T) + " Hk" + std::to_string(Hk) + "/Hv" +
                          std::to_string(Hv) + " Dk" + std::to_string(Dk) + " Dv" + std::to_string(Dv) + " W" + std::to_string(W) +
                          (pad ? "" : " from hidden " + std::to_string(hidden));
  if (deferred) {
    Tensor u = Tensor::empty({T, Hv * Dv}, DType::kF32), sq = Tensor::empty({T, Hv, parts}, DType::kF32);
    Tensor cs1 = host_copy(cs0), ss1 = host_copy(ss0);
    ops::cpu::gdn_decode(pad ? nullptr : &x, fused, hw, cs1, ss1, starts, sl, u, &sq);
    Tensor y_cpu = Tensor::empty({T, 96}, DType::kF32);
    ops::cpu::linear_scaled(u, ops::GroupScale{&sq, 1e-6f}, ow, y_cpu);
    const Tensor hsq = cuda::to_host(dsq);
    float sq_scale = 1.0f;
    for (int64_t i = 0; i < sq.numel(); ++i) sq_scale = std::max(sq_scale, std::fabs(sq.ptr<float>()[i]));
    report("gdn_decode deferred norm " + tag, std::max({max_abs_diff(cuda::to_host(dout), u), max_abs_diff(cuda::to_host(dss), ss),
                                                        max_abs_diff(cuda::to_host(dcs), cs), max_abs_diff(cuda::to_host(dfused), fused),
                                                        max_abs_diff(hsq, sq) / sq_scale}), 1e-4f);
    // (from 6 rows on tensor-core tiles, x rounded to float16, as below)
    report("linear_scaled after it " + tag, std::max(max_abs_diff(cuda::to_host(dy), y_ref), max_abs_diff(y_cpu, y_ref)),
           T >= 6 ? 5e-3f : 2e-3f);
    perf("gdn_decode deferred norm " + tag, double(S * Hv * Dk * Dv * 8) + (pad ? 0.0 : double(proj.nbytes())),
         [&] { ops::gdn_decode(dxp, dfused, dw, dcs, dss, dst, dsl, dout, &dsq); });
    perf("linear_scaled " + tag, double(ow.nbytes()), [&] { ops::linear_scaled(dout, ops::GroupScale{&dsq, 1e-6f}, dow, dy); });
    return;
  }
  report("gdn_decode " + tag, std::max({max_abs_diff(cuda::to_host(dout), ref), max_abs_diff(cuda::to_host(dss), ss),
                                        max_abs_diff(cuda::to_host(dcs), cs), max_abs_diff(cuda::to_host(dfused), fused)}), 1e-4f);
  // From 6 rows the projection runs on tensor-core tiles, which round x to float16 (K = 4096 here).
  report("linear after gdn_decode " + tag, max_abs_diff(cuda::to_host(dy), y_ref), T >= 6 ? 5e-3f : 2e-3f);
  perf("gdn_decode " + tag, double(S * Hv * Dk * Dv * 8) + (pad ? 0.0 : double(proj.nbytes())),
       [&] { ops::gdn_decode(dxp, dfused, dw, dcs, dss, dst, dsl, dout); });
}

void test_conv_and_norms(int64_t T, int64_t C, int64_t W, bool silu, int64_t extra_columns = 0) {
  // Three sequences (T, 1 and 1 tokens) in slots 2, 0 and -1 (a padding row) of three; x may be
  // wider than the channels (a fused projection).
  Tensor starts = Tensor::empty({4}, DType::kI32), sl = Tensor::empty({3}, DType::kI32);
  starts.ptr<int32_t>()[1] = int32_t(T), starts.ptr<int32_t>()[2] = int32_t(T + 1), starts.ptr<int32_t>()[3] = int32_t(T + 2);
  sl.ptr<int32_t>()[0] = 2, sl.ptr<int32_t>()[1] = 0, sl.ptr<int32_t>()[2] = -1;
  Tensor x = random_tensor({T + 2, C + extra_columns}), w = random_tensor({C, W}), st = random_tensor({3, C, W - 1});
  Tensor st_ref = Tensor::empty(st.shape(), DType::kF32), ref = Tensor::empty({T + 2, C}, DType::kF32);
  std::memcpy(st_ref.data(), st.data(), st.nbytes());
  ops::cpu::causal_conv1d(x, w, st_ref, starts, sl, ref, silu);
  Tensor dst = cuda::to_device(st), dout = Tensor::empty({T + 2, C}, DType::kF32, Device::kCUDA);
  ops::causal_conv1d(cuda::to_device(x), cuda::to_device(w), dst, cuda::to_device(starts), cuda::to_device(sl), dout, silu);
  report("causal_conv1d T" + std::to_string(T) + "+1+pad C" + std::to_string(C) + " of " + std::to_string(C + extra_columns) +
             " W" + std::to_string(W) + (silu ? " silu" : ""),
         std::max(max_abs_diff(cuda::to_host(dout), ref), max_abs_diff(cuda::to_host(dst), st_ref)), 1e-5f);

  const int64_t n = 128, rows = T * 3;
  Tensor a = random_tensor({rows, n}), gate = random_tensor({rows, n}), nw = random_tensor({n});
  Tensor a_ref = Tensor::empty(a.shape(), DType::kF32);
  std::memcpy(a_ref.data(), a.data(), a.nbytes());
  ops::cpu::l2_norm(a_ref, n, 1e-6f);
  Tensor da = cuda::to_device(a);
  ops::l2_norm(da, n, 1e-6f);
  report("l2_norm " + std::to_string(rows) + "x" + std::to_string(n), max_abs_diff(cuda::to_host(da), a_ref), 1e-6f);
  Tensor gref = Tensor::empty(a.shape(), DType::kF32), dg = Tensor::empty(a.shape(), DType::kF32, Device::kCUDA);
  ops::cpu::gated_rms_norm(a, gate, 0, nw, 1e-6f, gref);
  ops::gated_rms_norm(cuda::to_device(a), cuda::to_device(gate), 0, cuda::to_device(nw), 1e-6f, dg);
  report("gated_rms_norm " + std::to_string(rows) + "x" + std::to_string(n), max_abs_diff(cuda::to_host(dg), gref), 1e-5f);
  // the gates as a column window of a wider per-token row (3 heads of n per token, 50 columns in)
  Tensor wide = random_tensor({T, 3 * n + 70});
  ops::cpu::gated_rms_norm(a, wide, 50, nw, 1e-6f, gref);
  ops::gated_rms_norm(cuda::to_device(a), cuda::to_device(wide), 50, cuda::to_device(nw), 1e-6f, dg);
  report("gated_rms_norm gates from columns", max_abs_diff(cuda::to_host(dg), gref), 1e-5f);
}

void test_gdn_split_qkv(int64_t T, int64_t Hk, int64_t Dk, int64_t Hv, int64_t Dv) {
  Tensor mixed = random_tensor({T, 2 * Hk * Dk + Hv * Dv});
  Tensor q = Tensor::empty({T, Hk, Dk}, DType::kF32), k = Tensor::empty({T, Hk, Dk}, DType::kF32), v = Tensor::empty({T, Hv, Dv}, DType::kF32);
  ops::cpu::gdn_split_qkv(mixed, 1e-6f, q, k, v);
  Tensor dq = Tensor::empty(q.shape(), DType::kF32, Device::kCUDA), dk = Tensor::empty(k.shape(), DType::kF32, Device::kCUDA);
  Tensor dv = Tensor::empty(v.shape(), DType::kF32, Device::kCUDA);
  ops::gdn_split_qkv(cuda::to_device(mixed), 1e-6f, dq, dk, dv);
  report("gdn_split_qkv T" + std::to_string(T) + " Hk" + std::to_string(Hk) + " Dk" + std::to_string(Dk) + " Hv" +
             std::to_string(Hv) + " Dv" + std::to_string(Dv),
         std::max({max_abs_diff(cuda::to_host(dq), q), max_abs_diff(cuda::to_host(dk), k), max_abs_diff(cuda::to_host(dv), v)}),
         1e-6f);
}

void test_gates_and_combine() {
  const int64_t T = 13, Hv = 32, width = 200 + 2 * Hv, H = 96;
  Tensor fused = random_tensor({T, width}, DType::kF32, 3.0f), neg_a = random_tensor({Hv}), dtb = random_tensor({Hv});
  Tensor beta = Tensor::empty({T, Hv}, DType::kF32), g = Tensor::empty({T, Hv}, DType::kF32);
  ops::cpu::gdn_gates(fused, 200, neg_a, dtb, beta, g);
  Tensor db = Tensor::empty({T, Hv}, DType::kF32, Device::kCUDA), dg = Tensor::empty({T, Hv}, DType::kF32, Device::kCUDA);
  ops::gdn_gates(cuda::to_device(fused), 200, cuda::to_device(neg_a), cuda::to_device(dtb), db, dg);
  report("gdn_gates", std::max(max_abs_diff(cuda::to_host(db), beta), max_abs_diff(cuda::to_host(dg), g)), 1e-5f);

  Tensor x = random_tensor({T, H}), gate = random_tensor({T, H}, DType::kF32, 3.0f);
  Tensor dx = cuda::to_device(x);
  ops::cpu::sigmoid_mul(x, gate, 0);
  ops::sigmoid_mul(dx, cuda::to_device(gate), 0);
  report("sigmoid_mul", max_abs_diff(cuda::to_host(dx), x), 1e-6f);
  Tensor wide = random_tensor({T, H + 40}, DType::kF32, 3.0f), dx2 = cuda::to_device(x);
  ops::cpu::sigmoid_mul(x, wide, 40);
  ops::sigmoid_mul(dx2, cuda::to_device(wide), 40);
  report("sigmoid_mul gates from columns", max_abs_diff(cuda::to_host(dx2), x), 1e-6f);

  Tensor out = random_tensor({T, H}), y = random_tensor({5, H}), rows = Tensor::empty({5}, DType::kI32), w = random_tensor({5});
  const int32_t picks[5] = {0, 12, 3, 7, 5};
  std::copy(picks, picks + 5, rows.ptr<int32_t>());
  Tensor dout = cuda::to_device(out);
  ops::cpu::scatter_add_rows(out, rows, w, y);
  ops::scatter_add_rows(dout, cuda::to_device(rows), cuda::to_device(w), cuda::to_device(y));
  Tensor ys = random_tensor({T, H}), sg = random_tensor({T, 1});
  ops::cpu::add_gated_rows(out, ys, sg);
  ops::add_gated_rows(dout, cuda::to_device(ys), cuda::to_device(sg));
  report("scatter_add_rows + add_gated_rows", max_abs_diff(cuda::to_host(dout), out), 1e-5f);
}

// shared: the logits carry the shared expert's gate column, ids / weights its slot.
void test_moe_topk(int64_t T, int64_t E, int64_t K, bool renorm, bool shared = false) {
  const int64_t S = shared ? 1 : 0;
  Tensor logits = random_tensor({T, E + S}, DType::kF32, 2.0f);
  logits.ptr<float>()[3] = logits.ptr<float>()[5] = 9.0f;  // a tie at the top of token 0
  float* row1 = logits.ptr<float>() + (E + S);
  if (T > 1) std::fill(row1, row1 + E, 0.5f);  // token 1: every logit ties (the rounds take over)
  if (T > 2)  // token 2: 40 experts tie above the rest (ranked by id among the threshold's candidates)
    for (int64_t e = 0; e < 40; ++e) row1[(E + S) + (e * 7) % E] = 6.0f;
  Tensor ids = Tensor::empty({T, K + S}, DType::kI32), w = Tensor::empty({T, K + S}, DType::kF32);
  ops::cpu::moe_topk(logits, E, renorm, ids, w);
  Tensor dids = Tensor::empty({T, K + S}, DType::kI32, Device::kCUDA), dw = Tensor::empty({T, K + S}, DType::kF32, Device::kCUDA);
  ops::moe_topk(cuda::to_device(logits), E, renorm, dids, dw);
  Tensor gi = cuda::to_host(dids);
  int wrong = 0;
  for (int64_t i = 0; i < T * (K + S); ++i) wrong += gi.ptr<int32_t>()[i] != ids.ptr<int32_t>()[i];
  const std::string tag = std::to_string(T) + "x" + std::to_string(E) + " top" + std::to_string(K) + (renorm ? " renorm" : "") +
                          (shared ? " +shared" : "");
  report("moe_topk ids " + tag, float(wrong), 0.0f);
  report("moe_topk weights " + tag, max_abs_diff(cuda::to_host(dw), w), 1e-5f);
}

// Expert ids that differ between the device and the CPU, each reported with the CPU's logits of
// both experts; routed: the router's input, router [E + S, H]. A slot to which the CPU gives no
// weight is not counted: its softmax probability underflowed to 0 (logits ~100 apart), the CPU
// (as HF's softmax-then-top-k) then takes such experts by id and the device by logit, and neither
// carries any weight (the weights are compared on their own).
int64_t wrong_ids(const Tensor& device_ids, const Tensor& ids, const Tensor& weights, const Tensor& routed,
                  const Tensor& router) {
  const Tensor hid = cuda::to_host(device_ids);
  const int64_t T = ids.size(0), n = ids.size(1), E = router.size(0);
  Tensor logits;  // the CPU's, for the report: computed at the first difference
  int64_t wrong = 0;
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int32_t g = hid.ptr<int32_t>()[i], c = ids.ptr<int32_t>()[i];
    if (g == c) continue;
    if (!logits.defined()) logits = Tensor::empty({T, E}, DType::kF32), ops::cpu::linear(routed, router, nullptr, logits);
    const bool weightless = weights.ptr<float>()[i] == 0.0f;
    wrong += !weightless;
    const float* lt = logits.ptr<float>() + i / n * E;
    std::printf("     token %lld rank %lld: device expert %d (CPU logit %.6f), CPU expert %d (%.6f)%s\n",
                static_cast<long long>(i / n), static_cast<long long>(i % n), g, g >= 0 && g < E ? lt[g] : 0.0f, c,
                c >= 0 && c < E ? lt[c] : 0.0f, weightless ? ", no weight on the CPU: not counted" : "");
  }
  return wrong;
}

// Router logits + top-k in one op (one launch for decode batches of up to 4 tokens) against the
// CPU's linear + moe_topk; twice in a row (the arrival counter resets itself). With `first`, x is
// a block's output: the residual add + RMSNorm come first (the CPU's add_rms_norm), and the new
// residual and normed rows are compared too.
// ties (token 0, x given as is): 1, 40 experts tie at the top (ranked by id among the block's
// candidates); 2, every logit ties (the warp's rounds take over).
void test_moe_route(int64_t T, int64_t E, int64_t K, int64_t H, bool shared, bool first = false, int ties = 0) {
  const int64_t S = shared ? 1 : 0;
  Tensor x = random_tensor({T, H}), router = random_tensor({E + S, H}, DType::kF32, 1.0f);
  for (int64_t e = 0; ties && e < (ties == 1 ? 40 : E + S); ++e) {  // rows along x[0]: the same, largest logit
    float* row = router.ptr<float>() + (ties == 1 ? (e * 7) % E : e) * H;
    for (int64_t k = 0; k < H; ++k) row[k] = 2.0f * x.ptr<float>()[k];
  }
  Tensor res = random_tensor({T, H}), nw = random_tensor({H}), normed = Tensor::empty({T, H}, DType::kF32);
  Tensor ids = Tensor::empty({T, K + S}, DType::kI32), w = Tensor::empty({T, K + S}, DType::kF32);
  Tensor dres, dnormed = Tensor::empty({T, H}, DType::kF32, Device::kCUDA), dnw = cuda::to_device(nw);
  const ops::ResidualNorm cpu_first{&res, &nw, 1e-6f, &normed}, dev_first{&dres, &dnw, 1e-6f, &dnormed};
  Tensor dx = cuda::to_device(x), dr = cuda::to_device(router);
  Tensor dids = Tensor::empty(ids.shape(), DType::kI32, Device::kCUDA), dw = Tensor::empty(w.shape(), DType::kF32, Device::kCUDA);
  for (int rep = 0; rep < 2; ++rep) {
    dres = cuda::to_device(res);  // the residual before the add, each time
    ops::moe_route(dx, dr, E, true, dids, dw, first ? &dev_first : nullptr);
  }
  ops::cpu::moe_route(x, router, E, true, ids, w, first ? &cpu_first : nullptr);
  const int64_t wrong = wrong_ids(dids, ids, w, first ? normed : x, router);
  const std::string tag = std::to_string(T) + "x" + std::to_string(H) + " E" + std::to_string(E) + " top" +
                          std::to_string(K) + (shared ? " + shared" : "") + (first ? " after add + norm" : "") +
                          (ties == 1 ? " 40 tied at the top" : ties == 2 ? " all tied" : "");
  report("moe_route ids " + tag, float(wrong), 0.0f);
  report("moe_route weights " + tag, max_abs_diff(cuda::to_host(dw), w), 1e-4f);
  if (first) {
    report("moe_route residual " + tag, max_abs_diff(cuda::to_host(dres), res), 1e-6f);
    report("moe_route normed " + tag, max_abs_diff(cuda::to_host(dnormed), normed), 1e-5f);
  }
  perf("moe_route " + tag, double((E + S) * H * 4), [&] { ops::moe_route(dx, dr, E, true, dids, dw, first ? &dev_first : nullptr); });
}

// Experts as separate matrices (as the loader makes them), found through address tables on each
// side; the device side holds f16 down transposed, as the model places it for the CUDA kernels
// (4-bit blocks stay as stored).
struct Experts {
  std::vector<Tensor> host_mats, device_mats;
  ops::ExpertTable host, device;
  Experts(int64_t E, int64_t H, int64_t I, DType dt = DType::kF16) {
    const bool transposed = !is_block_dtype(dt);
    Tensor gu_at = Tensor::empty({E}, DType::kI64), dn_at = Tensor::empty({E}, DType::kI64);
    Tensor dgu_at = Tensor::empty({E}, DType::kI64), ddn_at = Tensor::empty({E}, DType::kI64);
    auto add = [&](Tensor m, Tensor& at, Tensor& dat, int64_t e, bool transpose = false) {
      host_mats.push_back(m);
      Tensor d = m;
      if (transpose) {
        d = Tensor::empty({m.size(1), m.size(0)}, m.dtype());
        ops::cpu::transpose(m, d);
      }
      device_mats.push_back(cuda::to_device(d));
      at.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(host_mats.back().data()));
      dat.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(device_mats.back().data()));
    };
    for (int64_t e = 0; e < E; ++e) {
      add(random_tensor({2 * I, H}, dt, 1.0f / std::sqrt(float(H))), gu_at, dgu_at, e);
      add(random_tensor({H, I}, dt, 1.0f / std::sqrt(float(I))), dn_at, ddn_at, e, transposed);
    }
    host = {gu_at, dn_at, dt, H, I};
    device = {cuda::to_device(dgu_at), cuda::to_device(ddn_at), dt, H, I, transposed};
  }
};

// Expert parallelism: the experts e % 3 == 1 held by another rank, their device table entries zero.
bool held_elsewhere(int64_t e) { return e % 3 == 1; }
ops::ExpertTable without_held_elsewhere(const ops::ExpertTable& dev, int64_t routed) {
  Tensor gu = cuda::to_host(dev.gate_up), dn = cuda::to_host(dev.down);
  for (int64_t e = 0; e < routed; ++e)
    if (held_elsewhere(e)) gu.ptr<int64_t>()[e] = 0, dn.ptr<int64_t>()[e] = 0;
  ops::ExpertTable t = dev;
  t.gate_up = cuda::to_device(gu), t.down = cuda::to_device(dn);
  return t;
}
// The routing weights the reference takes for such a table: 0 for those experts' pairs.
Tensor weights_held_here(const Tensor& ids, const Tensor& w, int64_t routed) {
  Tensor out = host_copy(w);
  for (int64_t p = 0; p < ids.numel(); ++p)
    if (ids.ptr<int32_t>()[p] < routed && held_elsewhere(ids.ptr<int32_t>()[p])) out.ptr<float>()[p] = 0.0f;
  return out;
}

// elsewhere: a third of the experts held by another rank (zero table entries; they add nothing).
void test_moe_experts(int64_t T, int64_t E, int64_t K, int64_t H, int64_t I, DType dt = DType::kF16,
                      bool elsewhere = false) {
  const Experts ex(E, H, I, dt);
  const ops::ExpertTable& host = ex.host;
  const ops::ExpertTable dev = elsewhere ? without_held_elsewhere(ex.device, E) : ex.device;
  Tensor ids = Tensor::empty({T, K}, DType::kI32), w = random_tensor({T, K}, DType::kF32, 0.3f);
  for (int64_t t = 0; t < T; ++t)  // K distinct experts per token
    for (int64_t k = 0; k < K; ++k) ids.ptr<int32_t>()[t * K + k] = int32_t((t * 7 + k * 3 + (k * k) / 2) % E);
  const Tensor w_ref = elsewhere ? weights_held_here(ids, w, E) : w;
  Tensor x = random_tensor({T, H}), ref = Tensor::empty({T, H}, DType::kF32);
  ops::cpu::moe_experts(x, ids, w_ref, host, ref, nullptr);
  Tensor dx = cuda::to_device(x), dids = cuda::to_device(ids), dw = cuda::to_device(w);
  Tensor dout = Tensor::empty({T, H}, DType::kF32, Device::kCUDA);
  ops::moe_experts(dx, dids, dw, dev, dout);
  const std::string tag = std::to_string(T) + " tokens E" + std::to_string(E) + " top" + std::to_string(K) + " " +
                          std::to_string(H) + "x" + std::to_string(I) + (dt == DType::kF16 ? "" : std::string(" ") + dtype_name(dt)) +
                          (elsewhere ? " (a third held elsewhere)" : "");
  // Prefill batches run tensor-core tiles with x rounded to f16: checked relative to the outputs.
  const float tol = T > 64 ? 2e-3f * max_abs(ref) : 1e-3f;
  report("moe_experts " + tag, max_abs_diff(cuda::to_host(dout), ref), tol);
  // with the residual add + norm by each token's last block (twice: the counters must reset)
  Tensor res = random_tensor({T, H}), nw = random_tensor({H}), normed = Tensor::empty({T, H}, DType::kF32);
  Tensor res_ref = Tensor::empty({T, H}, DType::kF32), dres = cuda::to_device(res), dnw = cuda::to_device(nw);
  std::memcpy(res_ref.data(), res.data(), res.nbytes());
  Tensor dnormed = Tensor::empty({T, H}, DType::kF32, Device::kCUDA);
  for (int rep = 0; rep < 2; ++rep) {
    Tensor scratch = Tensor::empty({T, H}, DType::kF32);
    const ops::ResidualNorm href{&res_ref, &nw, 1e-6f, &normed}, dref{&dres, &dnw, 1e-6f, &dnormed};
    ops::cpu::moe_experts(x, ids, w_ref, host, scratch, &href);
    ops::moe_experts(dx, dids, dw, dev, dout, &dref);
  }
  report("moe_experts " + tag + " + residual norm",
         std::max(max_abs_diff(cuda::to_host(dres), res_ref), max_abs_diff(cuda::to_host(dnormed), normed)),
         std::max(3e-3f, 4 * tol));
  perf("moe_experts " + tag, double(T * K) * double(dtype_bytes(dt, 3 * H * I)),
       [&] { ops::moe_experts(dx, dids, dw, dev, dout); }, T > 64 ? double(T * K * 3 * H * I * 2) : 0.0);
}

// The MoE block from the previous block's output (moe_route_experts: routing inside the experts'
// kernel for one token) against the CPU's moe_route + moe_experts, twice in a row (the counters
// re-arm). As in the model, `then` adds the experts' output to the same residual and writes the same
// normed tensor. shared: router row E is the shared expert's gate, the table's expert E the expert.
void test_moe_route_experts(int64_t T, int64_t E, int64_t K, int64_t H, int64_t I, bool shared, bool with_then,
                            bool warm = false, bool elsewhere = false) {
  const int64_t S = shared ? 1 : 0;
  const Experts ex(E + S, H, I);
  const ops::ExpertTable dev_table = elsewhere ? without_held_elsewhere(ex.device, E) : ex.device;
  Tensor x = random_tensor({T, H}), router = random_tensor({E + S, H}, DType::kF32, 1.0f);
  Tensor res = random_tensor({T, H}), nw = random_tensor({H}), nw2 = random_tensor({H});
  Tensor normed = Tensor::empty({T, H}, DType::kF32), out = Tensor::empty({T, H}, DType::kF32);
  Tensor ids = Tensor::empty({T, K + S}, DType::kI32), w = Tensor::empty({T, K + S}, DType::kF32);
  Tensor res_ref = Tensor::empty({T, H}, DType::kF32);
  std::memcpy(res_ref.data(), res.data(), res.nbytes());
  const ops::ResidualNorm cpu_first{&res_ref, &nw, 1e-6f, &normed}, cpu_then{&res_ref, &nw2, 1e-6f, &normed};
  ops::cpu::moe_route(x, router, E, true, ids, w, &cpu_first);  // moe_route_experts in its two steps
  ops::cpu::moe_experts(normed, ids, elsewhere ? weights_held_here(ids, w, E) : w, ex.host, out, with_then ? &cpu_then : nullptr);
  Tensor dx = cuda::to_device(x), dr = cuda::to_device(router), dnw = cuda::to_device(nw), dnw2 = cuda::to_device(nw2);
  Tensor dres, dnormed = Tensor::empty({T, H}, DType::kF32, Device::kCUDA), dout = Tensor::empty({T, H}, DType::kF32, Device::kCUDA);
  Tensor dids = Tensor::empty(ids.shape(), DType::kI32, Device::kCUDA), dw = Tensor::empty(w.shape(), DType::kF32, Device::kCUDA);
  const ops::ResidualNorm dev_first{&dres, &dnw, 1e-6f, &dnormed}, dev_then{&dres, &dnw2, 1e-6f, &dnormed};
  // warm: the next block's weights (any tensor of ~1 MB: a hint the results must not depend on)
  const Tensor ahead = warm ? cuda::to_device(random_tensor({257, 1031})) : Tensor();
  const Tensor* dwarm = warm ? &ahead : nullptr;
  for (int rep = 0; rep < 2; ++rep) {
    dres = cuda::to_device(res);  // the residual before the add, each time
    ops::moe_route_experts(dx, dr, E, true, dev_first, dids, dw, dev_table, dout, with_then ? &dev_then : nullptr, dwarm);
  }
  Tensor routed = Tensor::empty({T, H}, DType::kF32), res_routed = host_copy(res);
  ops::cpu::add_rms_norm(res_routed, x, nw, 1e-6f, routed);
  const int64_t wrong = wrong_ids(dids, ids, w, routed, router);
  const std::string tag = std::to_string(T) + "x" + std::to_string(H) + " E" + std::to_string(E) + " top" +
                          std::to_string(K) + " I" + std::to_string(I) + (shared ? " + shared" : "") +
                          (with_then ? " + residual norm" : "") + (warm ? " + L2 warm" : "") +
                          (elsewhere ? " (a third held elsewhere)" : "");
  report("moe_route_experts ids " + tag, float(wrong), 0.0f);
  report("moe_route_experts weights " + tag, max_abs_diff(cuda::to_host(dw), w), 1e-4f);
  report("moe_route_experts out " + tag, max_abs_diff(cuda::to_host(dout), out), 1e-3f);
  report("moe_route_experts residual + normed " + tag,
         std::max(max_abs_diff(cuda::to_host(dres), res_ref), max_abs_diff(cuda::to_host(dnormed), normed)),
         with_then ? 4e-3f : 1e-5f);
  perf("moe_route_experts " + tag, double(T * (K + S) * 3 * H * I * 2 + (E + S) * H * 4), [&] {
    ops::moe_route_experts(dx, dr, E, true, dev_first, dids, dw, dev_table, dout, with_then ? &dev_then : nullptr, dwarm);
  });
}

void test_argmax(int64_t R, int64_t V) {
  Tensor x = random_tensor({R, V}), ref = Tensor::empty({R}, DType::kI32);
  for (int64_t r = 0; r < R; ++r) {  // plant a tie for the maximum: the lower index must win
    const int64_t a = (r * 7919) % V, b = (a + 1 + (r * 31) % (V - 1)) % V;
    x.ptr<float>()[r * V + a] = x.ptr<float>()[r * V + b] = 100.0f;
  }
  ops::cpu::argmax(x, ref);
  Tensor dout = Tensor::empty({R}, DType::kI32, Device::kCUDA);
  ops::argmax(cuda::to_device(x), dout);
  Tensor got = cuda::to_host(dout);
  int wrong = 0;
  for (int64_t r = 0; r < R; ++r) wrong += got.ptr<int32_t>()[r] != ref.ptr<int32_t>()[r];
  const std::string tag = std::to_string(R) + "x" + std::to_string(V);
  report("argmax " + tag + " with ties", float(wrong), 0.0f);
  Tensor dx = cuda::to_device(x);
  perf("argmax " + tag, double(R * V * 4), [&] { ops::argmax(dx, dout); });
}

}  // namespace

// Every sampling case (penalties, masks and logit biases among each row's adjustments).
void run_sampling_cases() {
  ops::SampleRow greedy, plain, topk, topp, minp, all;
  greedy.num_logprobs = 5;
  plain.temperature = 1.0f;
  plain.num_logprobs = 0;
  topk.temperature = 0.7f, topk.top_k = 40;
  topp.temperature = 1.3f, topp.top_p = 0.8f, topp.repetition_penalty = 1.3f;
  minp.temperature = 1.0f, minp.min_p = 0.05f, minp.presence_penalty = 0.5f, minp.frequency_penalty = 0.3f;
  all.temperature = 0.9f, all.top_k = 100, all.top_p = 0.9f, all.min_p = 0.02f, all.num_logprobs = 20;
  test_sample(1000, greedy, "greedy");
  test_sample(151936, plain, "temperature");
  test_sample(32000, topk, "top-k");
  test_sample(128256, topp, "top-p + repetition");
  test_sample(49152, minp, "min-p + presence/frequency");
  test_sample(128256, all, "top-k + top-p + min-p");
}

int main(int argc, char** argv) {
  bool flash_next_only = false;  // --flash-next: only Flash-Next's cases (its kernels' quick check)
  bool sampling_only = false;    // --sampling: only the sampling cases
  bool vision_only = false;      // --vision: only the vision tower's and multimodal RoPE's cases
  bool spec_only = false;        // --spec: only speculative drafts' ops
  for (int i = 1; i < argc; ++i) {
    g_perf |= std::strcmp(argv[i], "--perf") == 0;
    if (std::strncmp(argv[i], "--perf=", 7) == 0) g_perf = true, g_perf_only = argv[i] + 7;
    flash_next_only |= std::strcmp(argv[i], "--flash-next") == 0;
    sampling_only |= std::strcmp(argv[i], "--sampling") == 0;
    vision_only |= std::strcmp(argv[i], "--vision") == 0;
    spec_only |= std::strcmp(argv[i], "--spec") == 0;
  }
  try {
    std::printf("device: %s\n", cuda::device_name().c_str());
    if (flash_next_only || sampling_only || vision_only || spec_only) {
      if (flash_next_only) run_flash_next_cases();
      if (sampling_only) run_sampling_cases();
      if (vision_only) run_vision_cases();
      if (spec_only) run_spec_cases();
      std::printf("%d passed, %d failed\n", g_passed, g_failed);
      return g_failed == 0 ? 0 : 1;
    }
    if (g_perf) std::printf("device-to-device copy bandwidth: %.0f GB/s (read + write)\n", cuda::measure_copy_bandwidth(size_t(1) << 30) / 1e9);
    for (int64_t rows : {1, 7, 257})
      for (int64_t n : {64, 576, 4096, 5120, 8192, 20000}) test_rms_norm(rows, n);
    for (int64_t rows : {1, 33, 512})
      for (int64_t I : {96, 1536, 12288}) test_silu_mul(rows, I);
    for (DType dt : {DType::kF32, DType::kF16})
      for (int64_t T : {1, 19}) test_embedding(1000, 576, T, dt);
    for (const char* type : {"default", "yarn", "llama3"}) {
      test_rope(1, 9, 64, 1.0, type);
      test_rope(37, 16, 128, 1.0, type);
      test_rope(300, 8, 256, 0.25, type);  // partial rotary (Qwen3-Next)
    }
    for (DType dt : {DType::kF32, DType::kF16}) {
      test_linear(1, 576, 576, dt, false);
      test_linear(3, 1000, 203, dt, true);   // K not a multiple of 8: the scalar tail
      test_linear(8, 4096, 4096, dt, false);
      test_linear(1, 14336, 4096, dt, false);
      test_linear(1, 2048, 4096, dt, true);   // an output projection (fewer rows than the four-row form wants)
      test_linear(1, 12352, 2048, dt, false);  // Qwen3-Next's DeltaNet input projection
      test_linear(1, 9216, 2048, dt, false);   // its attention QKV (f16: the whole-row form, four waves)
      test_linear(77, 1536, 576, dt, true);  // tiled path, ragged tiles
      test_linear(512, 4096, 4096, dt, false);
      test_linear(16, 4096, 4096, dt, false);   // split-K tensor-core fragments (decode batches)
      test_linear(32, 4096, 4096, dt, true);
      test_linear(64, 6144, 4096, dt, false);
      test_linear(13, 1024, 14336, dt, false);
      test_linear(40, 1000, 1024, dt, false);   // N % 16 != 0: small tiles
      test_linear(33, 1000, 200, dt, true);     // K % 8 != 0: the SIMT path
      test_linear(130, 1000, 1024, dt, true);   // ragged 128-row tiles
      for (int64_t m : {2, 3, 5})                 // GEMV with several rows per warp, ragged N
        test_linear(m, 1003, 1032, dt, m == 3);
    }
    test_linear(2048, 4096, 4096, DType::kF16, false);  // prefill-sized (TFLOP/s in --perf)
    // Split-K tensor-core decode batches: a last 64-row block with one live warp, with bias; three
    // fragments; Llama-8B's shapes at the GEMV / fragments threshold (every batch size with --perf).
    test_linear(20, 1040, 4096, DType::kF16, true);
    test_linear(45, 2064, 2048, DType::kF16, false);
    for (int64_t m : g_perf ? std::vector<int64_t>{2, 4, 5, 6, 8, 16, 32, 64} : std::vector<int64_t>{5, 6}) {
      test_linear(m, 6144, 4096, DType::kF16, false);
      test_linear(m, 28672, 4096, DType::kF16, false);
      test_linear(m, 4096, 14336, DType::kF16, false);
    }
    // Decode GEMVs of f16 weights: a ragged last row block with bias, fewer rows than warps on the
    // device, 2..4 rows, and an lm_head-sized N.
    test_linear(1, 1003, 1024, DType::kF16, true);
    test_linear(3, 40, 1536, DType::kF16, false);
    test_linear(4, 1000, 512, DType::kF16, true);
    test_linear(2, 2048, 4096, DType::kF16, false);
    test_linear(1, 32000, 2048, DType::kF16, false);
    for (int64_t m : {16, 32, 61})  // an f32 router (E + 1 rows) at decode batches past 8: GEMVs 8 rows at a time
      test_linear(m, 513, 2048, DType::kF32, false);
    // 4-bit group weights (AWQ): the GEMV at 1..8 rows, chunks of 8 up to 64, the f16 copy past it;
    // SmolLM2's down projection in groups of 32, Llama-8B's projections, a ragged N.
    for (DType dt : {DType::kI4G32, DType::kI4G128}) {
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 16, 64, 65, 200}) test_linear(m, 1003, 1024, dt, m % 2 == 1);
      test_linear(1, 4096, 4096, dt, false);
      test_linear(1, 28672, 4096, dt, false);
      test_linear(1, 4096, 14336, dt, false);
      test_linear(8, 4096, 4096, dt, false);
      test_linear(32, 4096, 4096, dt, false);
      test_linear(512, 4096, 4096, dt, false);
    }
    test_linear(1, 576, 1536, DType::kI4G32, false);
    test_paged_attention({{0, 1}}, 4, 4, 64, 16);                           // first decode token
    test_paged_attention({{100, 1}, {0, 37}, {250, 5}, {3000, 1}}, 32, 8, 128, 16);  // mixed, GQA 4
    test_paged_attention({{17, 1}, {64, 64}}, 9, 3, 64, 32);                // SmolLM2 heads, MQA-ish groups
    test_paged_attention({{40, 3}}, 16, 2, 256, 16);                        // head_dim 256 (Qwen3-Next)
    test_paged_attention({{8000, 1}}, 8, 2, 128, 16);                       // long decode: split-K
    test_paged_attention({{5000, 1}, {20, 1}, {3000, 1}}, 4, 1, 64, 32);    // splits, one of them near-empty
    for (DType kv : {DType::kF32, DType::kF16}) {  // tensor-core prefill tiles, with and without a prefix
      test_paged_attention({{0, 200}}, 8, 2, 128, 16, kv);
      test_paged_attention({{300, 130}, {0, 1}, {50, 64}, {7, 2}}, 12, 4, 64, 16, kv);
      test_paged_attention({{100, 1}, {0, 37}, {250, 5}, {3000, 1}}, 32, 8, 128, 16, kv, true);
      test_paged_attention({{100, 1}, {20, 1}, {3000, 1}}, 32, 8, 128, 16, kv, true);  // the graph path
    }
    test_paged_attention({{0, 2048}}, 32, 8, 128, 16, DType::kF16);  // a 2K prompt (TFLOP/s in --perf)
    // Decode steps as graphs replay them: the grid sized for max_model_len, most splits idle.
    test_paged_attention({{600, 1}}, 32, 8, 128, 16, DType::kF16, true, 4096);   // Llama-8B, concurrency 1
    test_paged_attention({{100, 1}, {7, 1}}, 8, 2, 32, 16, DType::kF16, true, 2048);  // head_dim 32
    test_paged_attention({{5000, 1}}, 16, 2, 256, 16, DType::kF16, true, 8192);  // head_dim 256, split
    test_paged_attention({{300, 1}, {0, 4}}, 6, 2, 80, 16);  // head_dim 80: no vector loads, no tiles
    test_data_movement();
    for (DType kv : {DType::kF32, DType::kF16}) {
      test_qkv_rope_cache(5, 32, 8, 128, 1.0, false, kv);
      test_qkv_rope_cache(9, 16, 2, 256, 0.25, true, kv);  // Qwen3-Next: partial rotary, QK norm
      test_qkv_rope_cache(3, 4, 2, 16, 1.0, true, kv);     // rotate-half pairs across lanes
    }
    run_sampling_cases();
    test_linear_swiglu(1, 14336, 4096);   // Llama-8B decode
    test_linear_swiglu(8, 14336, 4096);   // its batch of 8: the split-K fragments, then silu_mul
    test_linear_swiglu(8, 1537, 1024);    // a ragged last pair
    test_linear_swiglu(3, 300, 203);      // K % 8 != 0: GEMV + silu_mul
    test_linear_swiglu(40, 1536, 576);    // prefill-sized: GEMM + silu_mul
    test_gated_delta_rule({1, 1, 1, 1}, 2, 4, 128, 128);  // a decode batch, Qwen3-Next head dims
    test_gated_delta_rule({37}, 1, 2, 16, 16);            // tiny test configs
    test_gated_delta_rule({150, 1, 64}, 2, 4, 128, 128);  // prefill chunks beside a decode token
    test_gated_delta_rule({20, 3}, 2, 2, 32, 48);         // Dv not a multiple of 32
    test_gated_delta_rule({700, 1, 333}, 2, 4, 128, 128); // chunked: ragged last chunks, a decode row between
    test_gated_delta_rule({130, 64}, 1, 1, 64, 64);       // chunked at head dim 64, an exact chunk
    test_gdn_prefill(2048);
    test_gdn_decode({1}, 16, 32, 128, 128, 4);          // Qwen3-Next decode, concurrency 1
    test_gdn_decode({1, 1, 3, 1}, 16, 32, 128, 128, 4);  // several tokens in a sequence (speculative)
    test_gdn_decode({2, 1}, 2, 4, 16, 16, 4);            // tiny test configs
    test_gdn_decode({1, 4}, 1, 2, 32, 16, 3);
    test_gdn_decode({1, 2}, 2, 2, 64, 64, 4);            // one value head per key head
    test_gdn_decode({1, 1}, 1, 4, 32, 32, 4);            // four value heads per key head
    test_gdn_decode({2, 1}, 2, 4, 64, 160, 4);           // a ragged last column group
    test_gdn_decode({1, 2, 1, 1, 1}, 8, 16, 64, 160, 4);  // 128-column blocks (a larger batch), ragged
    test_gdn_decode({1}, 16, 32, 128, 128, 4, 2048);    // Qwen3-Next decode from the block's input
    test_gdn_decode({1}, 2, 4, 16, 16, 4, 64);          // tiny: an odd share of rows per block
    test_gdn_decode({1}, 1, 4, 32, 160, 3, 520);        // ragged columns, a hidden size past whole steps
    test_gdn_decode({1}, 16, 64, 128, 128, 4, 1024);    // 256 blocks: no room for two copies (an H200), its own kernel
    test_gdn_decode({2}, 16, 32, 128, 128, 4, 2048);    // two tokens: the projection as a kernel of its own
    // The gated norm left to the output projection (a one-token step): Qwen3-Next from the block's
    // input (the scaled whole-row GEMV), tiny ones (the scaled copy, then the linear layer), a
    // padding row, a ragged last column group, 128-column blocks, the non-projected narrow form.
    test_gdn_decode({1}, 16, 32, 128, 128, 4, 2048, true);
    test_gdn_decode({1}, 2, 4, 16, 16, 4, 64, true);
    test_gdn_decode({2, 1}, 2, 4, 64, 160, 4, 0, true);
    test_gdn_decode({1, 2, 1, 1, 1}, 8, 16, 64, 160, 4, 0, true);
    test_gdn_decode({1}, 16, 64, 128, 128, 4, 1024, true);
    test_gdn_decode({1}, 8, 16, 128, 128, 4, 1024, true);  // K = 2048: the other whole-row form
    test_conv_and_norms(1, 300, 4, true);
    test_conv_and_norms(50, 8192, 4, true);
    test_conv_and_norms(7, 33, 2, false, 21);
    test_conv_and_norms(3, 8192, 4, true, 4096 + 64);  // Qwen3-Next: conv over the fused projection
    test_conv_and_norms(20, 8192, 10, true);  // Flash-Next's PLE conv: kernel 4 dilated by 3, 4 x 2048 streams
    test_conv_and_norms(5, 300, 32, false);
    test_gdn_split_qkv(5, 16, 128, 32, 128);           // Qwen3-Next heads
    test_gdn_split_qkv(3, 1, 32, 2, 16);
    test_gates_and_combine();
    test_moe_topk(37, 512, 10, true);   // Qwen3-Next routing
    test_moe_topk(9, 512, 10, true, true);  // + the shared expert's gate column
    test_moe_topk(5, 64, 8, false);
    test_moe_topk(3, 700, 4, true, true);  // past the register-held form
    test_moe_experts(3, 16, 4, 256, 96);
    test_moe_route(1, 512, 10, 2048, true);  // Qwen3-Next decode routing
    test_moe_route(1, 512, 10, 2048, true, false, 1);  // the block's top-k ranks ties by id
    test_moe_route(1, 512, 10, 2048, true, false, 2);  // too many ties for the block: the warp's rounds
    test_moe_route(3, 64, 8, 256, false);
    test_moe_route(2, 64, 4, 4096, false);   // router rows too long to hold in registers
    test_moe_route(9, 512, 10, 256, true);   // past the fused form: linear + moe_topk
    test_moe_route(16, 512, 10, 2048, true);  // Qwen3-Next routing at concurrency 16
    test_moe_route(1, 512, 10, 2048, true, true);  // after the block's residual add + norm, one launch
    test_moe_route(4, 64, 8, 1000, false, true);   // a row of 250 float4s: a ragged last batch
    test_moe_route(4, 64, 4, 4096, true, true);    // past 48 KB of shared rows: add_rms_norm first
    test_moe_route(9, 512, 10, 256, true, true);   // past the fused form
    test_moe_experts(1, 64, 10, 2048, 512);   // Qwen3-Next decode, concurrency 1 (GB/s in --perf)
    test_moe_experts(100, 16, 4, 256, 96);     // prefill: grouped by expert on the device
    test_moe_experts(300, 64, 10, 512, 128);
    test_moe_experts(2100, 64, 10, 256, 128);    // two slices of the grouped path
    test_moe_experts(512, 64, 10, 2048, 512);    // Qwen3-Next's expert shape in a prefill
    test_moe_experts(8, 64, 10, 2048, 512);
    test_moe_experts(2, 64, 10, 2048, 512);   // 64-intermediate slices
    test_moe_experts(64, 64, 10, 2048, 512);  // the largest decode batch: 128-intermediate slices
    test_moe_experts(2, 16, 4, 4104, 64);     // hidden past two passes of the down columns
    test_moe_experts(5, 16, 4, 200, 40);      // a slice past I, hidden rows past the last full pass
    // 4-bit experts: the gate / up and down kernels up to 64 tokens (with and without the residual
    // norm), the grouped GEMMs on their f16 copies past it; Qwen3-Next's shape at concurrency 1 and 8
    test_moe_experts(1, 64, 10, 2048, 512, DType::kI4G128);
    test_moe_experts(8, 64, 10, 2048, 512, DType::kI4G128);
    test_moe_experts(64, 64, 10, 2048, 512, DType::kI4G32);
    test_moe_experts(3, 16, 4, 256, 128, DType::kI4G32);
    test_moe_experts(5, 16, 11, 384, 256, DType::kI4G32);  // slots past a whole number of down batches
    test_moe_experts(300, 64, 10, 512, 512, DType::kI4G128);
    test_argmax(1, 128256);  // a Llama-3 decode step at concurrency 1
    test_argmax(3, 49152);
    test_argmax(32, 151936);
    test_kv_cache_write(1, 8, 16, 3, 64);
    test_kv_cache_write(100, 16, 16, 8, 128);
    // Cases added last, so that their random tensors leave the cases above as they were. Gated
    // attention's output gate: one decode token per sequence (Qwen3-Next's heads; split-K), a
    // graph's device metadata, and a prefill tile (the gate applied after the tiles).
    test_paged_attention({{40, 1}, {3000, 1}}, 16, 2, 256, 16, DType::kF16, false, 0, true);
    test_paged_attention({{100, 1}, {7, 1}}, 16, 2, 256, 16, DType::kF16, true, 4096, true);
    test_paged_attention({{30, 1}, {0, 70}}, 8, 2, 128, 16, DType::kF16, false, 0, true);
    test_gdn_decode({1}, 2, 4, 16, 16, 4, 4104);  // an odd row per share past one block-wide step of its columns
    test_moe_route(1, 60, 4, 1000, true, true);  // after the add + norm, one token: columns past the row, a partial last block
    test_moe_experts(1, 1100, 4, 64, 32);  // an expert table past what the slice kernel copies to shared memory
    test_linear(1, 9217, 2048, DType::kF16, true);  // one token, a ragged last row group (QKV-sized)
    test_linear(1, 2047, 4096, DType::kF16, true);  // the whole-row form, a block with a warp past N
    test_embedding(300, 1001, 3, DType::kF16);  // a row of no whole 16-byte loads: the scalar path
    test_moe_route_experts(1, 512, 10, 2048, 512, true, true);  // Qwen3-Next decode: one kernel (GB/s in --perf)
    test_moe_route_experts(1, 512, 10, 2048, 512, true, false);
    test_moe_route_experts(1, 30, 4, 1000, 40, true, true);    // columns past the row, blocks past the router rows
    test_moe_route_experts(1, 64, 8, 256, 96, false, true);    // no shared expert
    test_moe_route_experts(3, 64, 8, 256, 96, true, true);     // three tokens: moe_route + moe_experts
    test_moe_route_experts(1, 64, 4, 4096, 64, true, true);    // rows past 2048 columns: moe_route + moe_experts
    test_moe_route_experts(1, 64, 8, 256, 96, true, true, true);  // the next block's weights warmed into L2 meanwhile
    // Expert parallelism: experts another rank holds skipped by every path (one kernel, the slice
    // kernel folded and not, grouped prefill, 4-bit decode and prefill).
    test_moe_route_experts(1, 128, 10, 2048, 512, false, true, false, true);  // (fewer experts: quicker to make)
    test_moe_route_experts(3, 64, 8, 256, 96, false, true, false, true);
    for (int64_t T : {1, 8, 64, 300}) test_moe_experts(T, 64, 10, 1024, 256, DType::kF16, true);
    for (int64_t T : {1, 8, 300}) test_moe_experts(T, 64, 10, 512, 512, DType::kI4G128, true);
    // qkv_rope_attention: the decode graph's one kernel (Llama's heads, SmolLM2's, head_dim 32;
    // split-K; a padding row), Qwen3-Next's (head_dim 256 with its gate, partial rotary, split-K at
    // 3000 and 5000: the two kernels), then batches it hands to qkv_rope_cache + paged_attention
    // (a prefill; host metadata).
    for (DType kv : {DType::kF16, DType::kF32}) {
      test_qkv_rope_attention({{40, 1}, {3000, 1}, {0, 1}}, 16, 2, 256, 0.25, true, kv, true, true);
      test_qkv_rope_attention({{5000, 1}}, 16, 2, 256, 0.25, true, kv, true);
      test_qkv_rope_attention({{100, 1}, {7, 1}}, 32, 8, 128, 1.0, false, kv, true);
      test_qkv_rope_attention({{17, 1}, {300, 1}}, 9, 3, 64, 1.0, true, kv, true, true);
      test_qkv_rope_attention({{100, 1}, {7, 1}}, 8, 2, 32, 1.0, false, kv, true);
      test_qkv_rope_attention({{40, 1}, {3000, 1}, {5000, 1}}, 8, 2, 128, 0.5, true, kv, true, true);  // split-K, partial
    }
    test_qkv_rope_attention({{30, 1}, {0, 20}}, 16, 2, 256, 0.25, true, DType::kF16, true);
    test_qkv_rope_attention({{30, 1}, {64, 1}}, 8, 2, 128, 1.0, true, DType::kF16, false);
    run_kv_quant_cases();
    // head_dim 256 (Qwen3-Next) on the prefill tiles: 32-row tiles, a ragged last one, prefixes,
    // float32 and float16 caches, the output gate; a 2K prompt alone and after 6K (TFLOP/s in --perf).
    for (DType kv : {DType::kF32, DType::kF16})  // (the quantized caches' cases: kv_quant_cases.cpp)
      test_paged_attention({{300, 130}, {0, 1}, {50, 64}, {7, 2}, {0, 33}}, 16, 2, 256, 16, kv);
    test_paged_attention({{30, 1}, {0, 70}}, 16, 2, 256, 16, DType::kF16, false, 0, true);
    test_paged_attention({{0, 2048}}, 16, 2, 256, 16, DType::kF16);
    test_paged_attention({{6144, 2048}}, 16, 2, 256, 16, DType::kF16);
    run_transfer_cases();
    run_flash_next_cases();
    run_vision_cases();
    run_spec_cases();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    ++g_failed;
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
