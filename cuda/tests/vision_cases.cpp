// The op harness's cases for the vision tower's ops and multimodal RoPE: each CUDA op against the
// CPU's, at the Qwen3.5 tower's widths (hidden 1152, MLP 4304, 16 heads of 72) and at odd ones;
// attention over packed sequences of ragged lengths (a 1024 x 1024 image: 4096 patches).
#include "harness.h"

namespace revolta::harness {
namespace {

Tensor int_tensor(const std::vector<int32_t>& v, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::kI32);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

void test_layer_norm(int64_t rows, int64_t n) {
  Tensor x = random_tensor({rows, n}, DType::kF32, 2.0f), w = random_tensor({n}), b = random_tensor({n});
  Tensor out = Tensor::empty({rows, n}, DType::kF32), dout = Tensor::empty({rows, n}, DType::kF32, Device::kCUDA);
  ops::cpu::layer_norm(x, w, b, 1e-6f, out);
  ops::layer_norm(cuda::to_device(x), cuda::to_device(w), cuda::to_device(b), 1e-6f, dout);
  report("layer_norm " + std::to_string(rows) + "x" + std::to_string(n), max_abs_diff(cuda::to_host(dout), out), 2e-5f);
}

void test_gelu(int64_t n, bool tanh) {
  Tensor x = random_tensor({n}, DType::kF32, 3.0f), dx = cuda::to_device(x);
  ops::cpu::gelu(x, tanh);
  ops::gelu(dx, tanh);
  report(std::string("gelu ") + (tanh ? "tanh " : "erf ") + std::to_string(n), max_abs_diff(cuda::to_host(dx), x), 1e-5f);
}

void test_scatter_rows() {
  Tensor out = random_tensor({40, 96}), src = random_tensor({5, 96});
  Tensor rows = int_tensor({3, 39, 0, 17, 18}, {5}), dout = cuda::to_device(out);
  ops::cpu::scatter_rows(out, rows, src);
  ops::scatter_rows(dout, cuda::to_device(rows), cuda::to_device(src));
  report("scatter_rows 5 of 40", max_abs_diff(cuda::to_host(dout), out), 0.0f);
}

void test_varlen_attention(const std::vector<int32_t>& lengths, int64_t heads, int64_t D) {
  std::vector<int32_t> starts{0};
  std::string tag;
  for (int32_t n : lengths) starts.push_back(starts.back() + n), tag += " " + std::to_string(n);
  const int64_t T = starts.back();
  Tensor q = random_tensor({T, heads, D}), k = random_tensor({T, heads, D}), v = random_tensor({T, heads, D});
  Tensor st = int_tensor(starts, {int64_t(starts.size())});
  const int32_t longest = *std::max_element(lengths.begin(), lengths.end());
  const float scale = 1.0f / std::sqrt(float(D));
  Tensor out = Tensor::empty({T, heads, D}, DType::kF32), dout = Tensor::empty({T, heads, D}, DType::kF32, Device::kCUDA);
  ops::cpu::varlen_attention(q, k, v, st, longest, scale, out);
  const Tensor dq = cuda::to_device(q), dk = cuda::to_device(k), dv = cuda::to_device(v), dst = cuda::to_device(st);
  ops::varlen_attention(dq, dk, dv, dst, longest, scale, dout);
  report("varlen_attention" + tag + " H" + std::to_string(heads) + " D" + std::to_string(D),
         max_abs_diff(cuda::to_host(dout), out), 5e-3f);  // fp16 tensor cores
  if (g_perf)
    perf("varlen_attention" + tag, double(q.nbytes()) * 4, [&] { ops::varlen_attention(dq, dk, dv, dst, longest, scale, dout); },
         4.0 * double(heads) * double(D) * [&] {
           double s = 0;
           for (int32_t n : lengths) s += double(n) * n;
           return s;
         }());
}

// rope with per-axis positions: the vision tower's (height, width) and the decoder's (t, h, w).
void test_rope_axes(int64_t T, int64_t heads, int64_t D, const std::vector<int32_t>& axes, int64_t A) {
  auto [host, dev] = rope_tables(D, double(2 * axes.size()) / double(D), 512);
  host.axes = int_tensor(axes, {int64_t(axes.size())});
  dev.axes = cuda::to_device(host.axes);
  std::vector<int32_t> pos(size_t(T * A));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t((i * 53 + i / size_t(A) * 7) % 512);
  Tensor p = int_tensor(pos, {T, A}), x = random_tensor({T, heads, D}), dx = cuda::to_device(x);
  ops::cpu::rope(x, p, host);
  ops::rope(dx, cuda::to_device(p), dev);
  report("rope " + std::to_string(A) + " axes " + std::to_string(T) + "x" + std::to_string(heads) + "x" + std::to_string(D),
         max_abs_diff(cuda::to_host(dx), x), 1e-5f);
}

// qkv_rope_cache / qkv_rope_attention with multimodal positions ([T, 3]: the unfused path).
void test_qkv_rope_mrope(int64_t T, int64_t H, int64_t KVH, int64_t D) {
  const int64_t half = D / 4;  // partial rotary 0.5: D / 4 frequencies
  std::vector<int32_t> axes(size_t(half), 0);
  for (int64_t i = 0; i < half; ++i) axes[size_t(i)] = i % 3 == 1 && i < 3 * (half / 4) ? 1 : i % 3 == 2 && i < 3 * (half / 4) ? 2 : 0;
  auto [host, dev] = rope_tables(D, 0.5, 1024);
  host.axes = int_tensor(axes, {half});
  dev.axes = cuda::to_device(host.axes);
  const int64_t blocks = 8, bs = 16;
  std::vector<int32_t> pos(static_cast<size_t>(T * 3)), slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    for (int a = 0; a < 3; ++a) pos[size_t(t * 3 + a)] = int32_t((t * 5 + a * 11) % 1024);
    slot[size_t(t)] = int32_t((t * 37 + 5) % (blocks * bs));
  }
  Tensor qkv = random_tensor({T, (H + 2 * KVH) * D}), p = int_tensor(pos, {T, 3}), slots = int_tensor(slot, {T});
  Tensor kc = Tensor::empty({blocks, bs, KVH, D}, DType::kF32), vc = Tensor::empty({blocks, bs, KVH, D}, DType::kF32);
  Tensor q = Tensor::empty({T, H, D}, DType::kF32), dq = Tensor::empty({T, H, D}, DType::kF32, Device::kCUDA);
  Tensor dkc = Tensor::empty(kc.shape(), DType::kF32, Device::kCUDA), dvc = Tensor::empty(vc.shape(), DType::kF32, Device::kCUDA);
  ops::cpu::qkv_rope_cache(qkv, {}, p, host, slots, q, kc, vc, nullptr);
  ops::qkv_rope_cache(cuda::to_device(qkv), {}, cuda::to_device(p), dev, cuda::to_device(slots), dq, dkc, dvc);
  const float err = std::max({max_abs_diff(cuda::to_host(dq), q), max_abs_diff(cuda::to_host(dkc), kc),
                              max_abs_diff(cuda::to_host(dvc), vc)});
  report("qkv_rope_cache mrope T" + std::to_string(T) + " H" + std::to_string(H) + " D" + std::to_string(D), err, 1e-5f);
}

// Timing only (--perf): the tower's GEMMs at one 1024 x 1024 image, Qwen3.5's shapes; their results
// are checked by the GPU tower test against the CPU.
void perf_tower_linears() {
  const int64_t M = 4096;
  for (auto [N, K] : {std::pair<int64_t, int64_t>{3456, 1152}, {1152, 1152}, {4304, 1152}, {1152, 4304}}) {
    const Tensor x = cuda::to_device(random_tensor({M, K})), w = cuda::to_device(random_tensor({N, K}, DType::kF16, 0.05f));
    const Tensor b = cuda::to_device(random_tensor({N}));
    Tensor out = Tensor::empty({M, N}, DType::kF32, Device::kCUDA);
    perf("tower linear " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K),
         double(N * K * 2 + M * K * 4 + M * N * 4), [&] { ops::linear(x, w, &b, out); }, 2.0 * double(M * N * K));
  }
}

}  // namespace

void run_vision_cases() {
  for (int64_t rows : {1, 37, 4096})
    for (int64_t n : {32, 1152, 1280}) test_layer_norm(rows, n);
  for (bool tanh : {true, false}) test_gelu(4304 * 33 + 5, tanh);
  test_scatter_rows();
  test_varlen_attention({16}, 2, 16);
  test_varlen_attention({64, 300, 4, 1}, 16, 72);   // Qwen3.5's tower: ragged images
  test_varlen_attention({257, 1000}, 4, 80);
  test_varlen_attention({4096}, 16, 72);            // a 1024 x 1024 image
  test_varlen_attention({100, 33}, 2, 128);
  if (g_perf) perf_tower_linears();
  test_rope_axes(300, 16, 72, [] {                   // the tower's 2-D rotary: height, then width
    std::vector<int32_t> a(36);
    for (int i = 0; i < 36; ++i) a[size_t(i)] = i < 18 ? 0 : 1;
    return a;
  }(), 2);
  test_rope_axes(19, 8, 64, [] {                     // interleaved t h w over the first 24 of 32
    std::vector<int32_t> a(32, 0);
    for (int i = 1; i < 24; i += 3) a[size_t(i)] = 1, a[size_t(i + 1)] = 2;
    return a;
  }(), 3);
  test_qkv_rope_mrope(23, 16, 2, 256);  // Qwen3.5's attention: head_dim 256, partial rotary
  test_qkv_rope_mrope(5, 4, 2, 64);
}

}  // namespace revolta::harness
