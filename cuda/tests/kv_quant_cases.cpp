// The op harness's cases for E4M3 and int8 KV caches: every CUDA reader and writer of the cache
// against the CPU's, which defines the formats (ops::KvQuant). Writers are compared code by code
// (the E4M3 byte or int8 value a slot holds), readers on caches the CPU wrote.
#include "harness.h"

namespace revolta::harness {
namespace {

// An E4M3 / int8 code as a signed step index, so that neighbouring codes differ by 1.
int code_index(uint8_t b, DType dt) {
  if (dt == DType::kI8) return int(int8_t(b));
  return (b & 0x80) ? -int(b & 0x7f) : int(b & 0x7f);
}

// The largest step between two caches' codes, and the largest relative difference of their int8
// row scales.
std::pair<int, float> code_diff(const Tensor& a, const Tensor& b, const ops::KvQuant& qa, const ops::KvQuant& qb) {
  int steps = 0;
  const auto *x = static_cast<const uint8_t*>(a.data()), *y = static_cast<const uint8_t*>(b.data());
  for (int64_t i = 0; i < a.numel(); ++i) steps = std::max(steps, std::abs(code_index(x[i], a.dtype()) - code_index(y[i], a.dtype())));
  float rel = 0.0f;
  for (const auto& [ra, rb] : {std::pair{&qa.k_rows, &qb.k_rows}, std::pair{&qa.v_rows, &qb.v_rows}}) {
    if (!ra->defined()) continue;
    for (int64_t i = 0; i < ra->numel(); ++i) {
      const float u = ra->ptr<float>()[i], w = rb->ptr<float>()[i];
      rel = std::max(rel, std::fabs(u - w) / std::max(1e-30f, std::fabs(u)));
    }
  }
  return {steps, rel};
}

// A quantized K and V pool [blocks, bs, KVH, D] with its scales, on the host and on the device.
struct QuantPool {
  Tensor hk, hv, dk, dv;
  ops::KvQuant hq, dq;

  QuantPool(int blocks, int bs, int KVH, int D, DType dt, float k_scale, float v_scale) {
    hk = Tensor::empty({blocks, bs, KVH, D}, dt), hv = Tensor::empty({blocks, bs, KVH, D}, dt);
    std::memset(hk.data(), 0, hk.nbytes()), std::memset(hv.data(), 0, hv.nbytes());
    hq.k = k_scale, hq.v = v_scale;
    if (dt == DType::kI8) {
      hq.k_rows = Tensor::empty({blocks, bs, KVH}, DType::kF32), hq.v_rows = Tensor::empty({blocks, bs, KVH}, DType::kF32);
      std::memset(hq.k_rows.data(), 0, hq.k_rows.nbytes()), std::memset(hq.v_rows.data(), 0, hq.v_rows.nbytes());
    }
    upload();
  }
  void upload() {
    dk = cuda::to_device(hk), dv = cuda::to_device(hv);
    dq = hq;
    if (hq.k_rows.defined()) dq.k_rows = cuda::to_device(hq.k_rows), dq.v_rows = cuda::to_device(hq.v_rows);
  }
  // Every slot written by the CPU with random values of standard deviation `sd`.
  void fill(float sd) {
    const int64_t slots = hk.size(0) * hk.size(1), KVH = hk.size(2), D = hk.size(3);
    Tensor k = random_tensor({slots, KVH, D}, DType::kF32, sd), v = random_tensor({slots, KVH, D}, DType::kF32, sd);
    Tensor ids = Tensor::empty({slots}, DType::kI32);
    for (int64_t i = 0; i < slots; ++i) ids.ptr<int32_t>()[i] = int32_t(i);
    ops::cpu::kv_cache_write(k, v, ids, hk, hv, &hq);
    upload();
  }
  // The device's pool back on the host, beside the host's.
  std::pair<int, float> diff() const {
    ops::KvQuant back = dq;
    if (dq.k_rows.defined()) back.k_rows = cuda::to_host(dq.k_rows), back.v_rows = cuda::to_host(dq.v_rows);
    const auto [ks, kr] = code_diff(hk, cuda::to_host(dk), hq, back);
    const auto [vs, vr] = code_diff(hv, cuda::to_host(dv), hq, back);
    return {std::max(ks, vs), std::max(kr, vr)};
  }
};

std::string dt_tag(DType dt) { return dt == DType::kI8 ? "int8" : "e4m3"; }

// kv_cache_write: the same codes as the CPU's, saturated ones included (sd large for the scale).
void test_write(int64_t T, int KVH, int D, DType dt, float sd) {
  QuantPool pool(8, 16, KVH, D, dt, 0.02f, 0.05f);
  Tensor k = random_tensor({T, KVH, D}, DType::kF32, sd), v = random_tensor({T, KVH, D}, DType::kF32, sd);
  Tensor slots = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) slots.ptr<int32_t>()[i] = i == 2 ? -1 : int32_t((i * 37 + 5) % 128);  // row 2: padding
  ops::cpu::kv_cache_write(k, v, slots, pool.hk, pool.hv, &pool.hq);
  ops::kv_cache_write(cuda::to_device(k), cuda::to_device(v), cuda::to_device(slots), pool.dk, pool.dv, &pool.dq);
  const auto [steps, rel] = pool.diff();
  const std::string tag = std::to_string(T) + " tokens KV" + std::to_string(KVH) + " D" + std::to_string(D) + " sd " +
                          std::to_string(int(sd)) + " " + dt_tag(dt);
  report("kv_cache_write codes " + tag, float(steps), 0.0f);
  report("kv_cache_write row scales " + tag, rel, 0.0f);
}

// qkv_rope_cache: q as the CPU's; the codes within a step (a value the CPU and the GPU round a
// last bit apart may fall either side of a code boundary).
void test_qkv_rope_cache(int64_t T, int H, int KVH, int D, double partial, bool qk_norm, DType dt) {
  const auto tables = rope_tables(D, partial, 2048);
  QuantPool pool(8, 16, KVH, D, dt, 0.01f, 0.02f);
  Tensor qkv = random_tensor({T, (H + 2 * KVH) * int64_t(D)}), pos = Tensor::empty({T}, DType::kI32);
  Tensor slots = Tensor::empty({T}, DType::kI32);
  for (int64_t i = 0; i < T; ++i) {
    pos.ptr<int32_t>()[i] = int32_t((i * 97) % 2048);
    slots.ptr<int32_t>()[i] = i == 1 ? -1 : int32_t((i * 37 + 5) % 128);
  }
  Tensor qn = random_tensor({D}), kn = random_tensor({D}), dqn = cuda::to_device(qn), dkn = cuda::to_device(kn);
  ops::QkNorm host_norm, dev_norm;
  if (qk_norm) host_norm = {&qn, &kn, 1e-6f}, dev_norm = {&dqn, &dkn, 1e-6f};
  Tensor q = Tensor::empty({T, H, D}, DType::kF32), dq = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA);
  ops::cpu::qkv_rope_cache(qkv, host_norm, pos, tables.first, slots, q, pool.hk, pool.hv, &pool.hq);
  ops::qkv_rope_cache(cuda::to_device(qkv), dev_norm, cuda::to_device(pos), tables.second, cuda::to_device(slots), dq,
                      pool.dk, pool.dv, &pool.dq);
  const auto [steps, rel] = pool.diff();
  const std::string tag = "T" + std::to_string(T) + " H" + std::to_string(H) + "/KV" + std::to_string(KVH) + " D" +
                          std::to_string(D) + " " + dt_tag(dt);
  report("qkv_rope_cache q " + tag, max_abs_diff(cuda::to_host(dq), q), 1e-5f);
  report("qkv_rope_cache codes " + tag, float(steps), 1.0f);
  report("qkv_rope_cache row scales " + tag, rel, 1e-5f);
}

// paged_attention over a pool the CPU wrote: decode rows (host or device metadata: the graph's
// path, split-K for long contexts) and prefill tiles (tensor cores for head_dim 64 / 128 / 256).
void test_attention(std::vector<std::pair<int, int>> seqs, int H, int KVH, int D, DType dt, bool device_metadata,
                    bool gated = false) {
  const int bs = 16;
  TestBatch tb(seqs, bs);
  QuantPool pool(tb.total_blocks, bs, KVH, D, dt, 0.015f, 0.01f);
  pool.fill(1.0f);
  Tensor q = random_tensor({tb.T, H, D}), ref = Tensor::empty({tb.T, H, D}, DType::kF32);
  Tensor gate = gated ? random_tensor({tb.T, int64_t(H) * D + 11}, DType::kF32, 2.0f) : Tensor();
  Tensor dgate = gated ? cuda::to_device(gate) : Tensor();
  const ops::OutputGate hg{&gate, 7}, dg{&dgate, 7};
  const float scale = 1.0f / std::sqrt(float(D));
  ops::cpu::paged_attention(q, pool.hk, pool.hv, tb.b, scale, ref, gated ? &hg : nullptr, &pool.hq);
  if (device_metadata) tb.on_device(4096);
  Tensor dq = cuda::to_device(q), dout = Tensor::empty({tb.T, H, D}, DType::kF32, Device::kCUDA);
  auto run = [&] { ops::paged_attention(dq, pool.dk, pool.dv, tb.b, scale, dout, gated ? &dg : nullptr, &pool.dq); };
  run();
  int64_t kv_bytes = 0;
  for (auto [cached, fresh] : seqs) kv_bytes += int64_t(cached + fresh) * KVH * D * 2;
  const std::string tag = std::to_string(seqs.size()) + " seqs " + std::to_string(tb.T) + " tokens H" + std::to_string(H) +
                          "/KV" + std::to_string(KVH) + " D" + std::to_string(D) + " " + dt_tag(dt) +
                          (device_metadata ? " dev-meta" : "") + (gated ? " gated" : "");
  perf("paged_attention " + tag, double(kv_bytes), run);
  const bool tensor_cores = !tb.all_decode && (D == 64 || D == 128 || D == 256);
  report("paged_attention " + tag, max_abs_diff(cuda::to_host(dout), ref), tensor_cores ? 2e-2f : 1e-4f);
}

// qkv_rope_attention (quantized caches take qkv_rope_cache + paged_attention) against the CPU's.
void test_rope_attention(std::vector<std::pair<int, int>> seqs, int H, int KVH, int D, double partial, DType dt) {
  const int bs = 16;
  TestBatch tb(seqs, bs);
  const auto tables = rope_tables(D, partial, 8192);
  QuantPool pool(tb.total_blocks, bs, KVH, D, dt, 0.02f, 0.01f);
  pool.fill(1.0f);
  Tensor qkv = random_tensor({tb.T, (H + 2 * KVH) * int64_t(D)});
  Tensor pos = Tensor::empty({tb.T}, DType::kI32), slots = Tensor::empty({tb.T}, DType::kI32);
  for (int t = 0; t < tb.T; ++t) pos.ptr<int32_t>()[t] = tb.position(t), slots.ptr<int32_t>()[t] = tb.slot(t);
  const float scale = 1.0f / std::sqrt(float(D));
  Tensor q = Tensor::empty({tb.T, H, D}, DType::kF32), out = Tensor::empty({tb.T, H, D}, DType::kF32);
  ops::cpu::qkv_rope_attention(qkv, {}, pos, tables.first, slots, q, pool.hk, pool.hv, tb.b, scale, out, nullptr, &pool.hq);
  tb.on_device(4096);
  Tensor dq = Tensor::empty({tb.T, H, D}, DType::kF32, Device::kCUDA), dout = Tensor::empty({tb.T, H, D}, DType::kF32, Device::kCUDA);
  ops::qkv_rope_attention(cuda::to_device(qkv), {}, cuda::to_device(pos), tables.second, cuda::to_device(slots), dq, pool.dk,
                          pool.dv, tb.b, scale, dout, nullptr, &pool.dq);
  const int steps = pool.diff().first;
  const std::string tag = std::to_string(seqs.size()) + " seqs H" + std::to_string(H) + "/KV" + std::to_string(KVH) + " D" +
                          std::to_string(D) + " " + dt_tag(dt);
  // A code a step apart moves a score by a step of one of its products: looser than over equal caches.
  report("qkv_rope_attention " + tag, max_abs_diff(cuda::to_host(dout), out), 2e-3f);
  report("qkv_rope_attention codes " + tag, float(steps), 1.0f);
}

}  // namespace

void run_kv_quant_cases() {
  for (DType dt : {DType::kF8E4M3, DType::kI8}) {
    test_write(1, 3, 64, dt, 1.0f);
    test_write(100, 8, 128, dt, 1.0f);
    test_write(37, 2, 256, dt, 20.0f);  // E4M3: past 448 x scale, saturated
    test_qkv_rope_cache(5, 32, 8, 128, 1.0, false, dt);
    test_qkv_rope_cache(9, 16, 2, 256, 0.25, true, dt);
    test_qkv_rope_cache(3, 4, 2, 16, 1.0, true, dt);
    test_attention({{0, 1}}, 4, 4, 64, dt, false);
    test_attention({{100, 1}, {0, 37}, {250, 5}, {3000, 1}}, 32, 8, 128, dt, false);  // mixed: tiles + decode rows
    test_attention({{300, 130}, {0, 1}, {50, 64}, {7, 2}}, 12, 4, 64, dt, false);
    test_attention({{100, 1}, {20, 1}, {3000, 1}}, 32, 8, 128, dt, true);  // the graph's path, split-K
    test_attention({{40, 1}, {5000, 1}}, 16, 2, 256, dt, true, true);      // Qwen3-Next's heads, gated
    test_attention({{40, 3}}, 16, 2, 256, dt, false);                       // head_dim 256: 32-row tiles
    test_attention({{300, 130}, {0, 1}, {7, 2}, {0, 33}}, 16, 2, 256, dt, false);
    test_attention({{100, 1}, {7, 1}}, 8, 2, 32, dt, true);                 // head_dim 32: scalar loads
    test_attention({{300, 1}, {0, 4}}, 6, 2, 80, dt, false);                // head_dim 80: no vector loads
    test_rope_attention({{40, 1}, {3000, 1}}, 16, 2, 256, 0.25, dt);
    test_rope_attention({{100, 1}, {7, 1}}, 32, 8, 128, 1.0, dt);
    test_rope_attention({{17, 1}, {300, 1}}, 9, 3, 64, 1.0, dt);
    test_rope_attention({{30, 1}, {0, 40}}, 8, 2, 32, 1.0, dt);  // head_dim 32, a prefill beside a decode row
  }
}

}  // namespace revolta::harness
