// Weight layouts made at load: a tensor-parallel rank's slices read from a safetensors file; ops::transpose (the experts' down matrices for the CUDA kernels)
// against its definition, and the expert path of a backend refusing a layout it does not read;
// gdn_decode given the block's input, which makes its projection part of the op; experts another
// rank holds (zero table entries) adding nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "expect.h"
#include "model/weights.h"
#include "ops/ops.h"

using namespace revolta;

namespace {

// Sizes that end inside the CPU's 64 x 64 tiles, for both element sizes the op takes.
void test_transpose_definition() {
  const int64_t R = 67, C = 130;
  for (DType dt : {DType::kF32, DType::kF16}) {
    Tensor x = Tensor::empty({R, C}, dt), out = Tensor::empty({C, R}, dt);
    ops::fill_uniform(x, 7, -1.0f, 1.0f);
    ops::transpose(x, out);
    const size_t es = dtype_size(dt);
    const char* src = static_cast<const char*>(x.data());
    const char* dst = static_cast<const char*>(out.data());
    int64_t wrong = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) wrong += std::memcmp(dst + size_t(c * R + r) * es, src + size_t(r * C + c) * es, es) != 0;
    EXPECT(wrong == 0);
    Tensor back = Tensor::empty({R, C}, dt);  // twice is the identity
    ops::transpose(out, back);
    EXPECT(std::memcmp(back.data(), x.data(), x.nbytes()) == 0);
  }
}

void test_transpose_rejects_mismatched_shapes() {
  Tensor x = Tensor::empty({4, 6}, DType::kF32);
  Tensor same = Tensor::empty({4, 6}, DType::kF32), half = Tensor::empty({6, 4}, DType::kF16);
  EXPECT(throws_naming([&] { ops::transpose(x, same); }, "transpose"));
  EXPECT(throws_naming([&] { ops::transpose(x, half); }, "transpose"));
}

// The CPU reads down as [hidden, inter]: a table marked transposed is refused, not misread.
void test_cpu_experts_refuse_transposed_down() {
  const int64_t H = 8, I = 8;
  Tensor gu = Tensor::empty({2 * I, H}, DType::kF32), dn = Tensor::empty({I, H}, DType::kF32);
  Tensor gu_at = Tensor::empty({1}, DType::kI64), dn_at = Tensor::empty({1}, DType::kI64);
  gu_at.ptr<int64_t>()[0] = int64_t(reinterpret_cast<intptr_t>(gu.data()));
  dn_at.ptr<int64_t>()[0] = int64_t(reinterpret_cast<intptr_t>(dn.data()));
  ops::ExpertTable table{gu_at, dn_at, DType::kF32, H, I, /*down_transposed=*/true};
  Tensor x = Tensor::empty({1, H}, DType::kF32), ids = Tensor::empty({1, 1}, DType::kI32);
  Tensor w = Tensor::empty({1, 1}, DType::kF32), out = Tensor::empty({1, H}, DType::kF32);
  EXPECT(throws_naming([&] { ops::moe_experts(x, ids, w, table, out); }, "transposed"));
  table.down_transposed = false;  // the same call on the layout it reads runs
  EXPECT(!throws_naming([&] { ops::moe_experts(x, ids, w, table, out); }, ""));
}

// Expert parallelism leaves other ranks' experts out of the table (zero addresses): their pairs add
// nothing, as the whole table with those pairs' routing weights set to 0 gives.
void test_experts_held_elsewhere_add_nothing() {
  const int64_t E = 4, H = 16, I = 8, T = 3, K = 2;
  std::vector<Tensor> mats;
  Tensor gu_at = Tensor::empty({E}, DType::kI64), dn_at = Tensor::empty({E}, DType::kI64);
  for (int64_t e = 0; e < E; ++e) {
    mats.push_back(Tensor::empty({2 * I, H}, DType::kF32)), mats.push_back(Tensor::empty({H, I}, DType::kF32));
    ops::fill_uniform(mats[size_t(2 * e)], uint64_t(10 + e), -0.5f, 0.5f);
    ops::fill_uniform(mats[size_t(2 * e + 1)], uint64_t(20 + e), -0.5f, 0.5f);
    gu_at.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(mats[size_t(2 * e)].data()));
    dn_at.ptr<int64_t>()[e] = int64_t(reinterpret_cast<intptr_t>(mats[size_t(2 * e + 1)].data()));
  }
  Tensor x = Tensor::empty({T, H}, DType::kF32), ids = Tensor::empty({T, K}, DType::kI32);
  Tensor w = Tensor::empty({T, K}, DType::kF32), zeroed = Tensor::empty({T, K}, DType::kF32);
  ops::fill_uniform(x, 3, -1.0f, 1.0f);
  ops::fill_uniform(w, 4, 0.1f, 0.9f);
  const int32_t pick[T * K] = {0, 1, 1, 2, 3, 2};  // experts 1 and 3 are held elsewhere
  for (int64_t p = 0; p < T * K; ++p) {
    ids.ptr<int32_t>()[p] = pick[p];
    zeroed.ptr<float>()[p] = pick[p] == 1 || pick[p] == 3 ? 0.0f : w.ptr<float>()[p];
  }
  Tensor want = Tensor::empty({T, H}, DType::kF32), got = Tensor::empty({T, H}, DType::kF32);
  ops::moe_experts(x, ids, zeroed, {gu_at, dn_at, DType::kF32, H, I}, want);
  Tensor held_gu = Tensor::empty({E}, DType::kI64), held_dn = Tensor::empty({E}, DType::kI64);
  for (int64_t e : {0, 2})
    held_gu.ptr<int64_t>()[e] = gu_at.ptr<int64_t>()[e], held_dn.ptr<int64_t>()[e] = dn_at.ptr<int64_t>()[e];
  ops::moe_experts(x, ids, w, {held_gu, held_dn, DType::kF32, H, I}, got);
  float diff = 0.0f, size = 0.0f;
  for (int64_t i = 0; i < T * H; ++i)
    diff = std::max(diff, std::fabs(want.ptr<float>()[i] - got.ptr<float>()[i])), size += std::fabs(want.ptr<float>()[i]);
  EXPECT(diff == 0.0f && size > 0.0f);
}

// gdn_decode from the block's input: fused becomes x . proj^T and the step is the one taken from
// that fused row (state, conv windows and output alike); without the projection, or with an input
// of another width, it is refused.
void test_gdn_decode_from_input() {
  const int64_t Hk = 1, Hv = 2, Dk = 8, Dv = 8, W = 4, H = 16, C = 2 * Hk * Dk + Hv * Dv, width = C + Hv * Dv + 2 * Hv;
  Tensor x = Tensor::empty({1, H}, DType::kF32), proj = Tensor::empty({width, H}, DType::kF32);
  Tensor conv = Tensor::empty({C, W}, DType::kF32), neg_a = Tensor::empty({Hv}, DType::kF32);
  Tensor dt_bias = Tensor::empty({Hv}, DType::kF32), norm = Tensor::empty({Dv}, DType::kF32);
  ops::fill_uniform(x, 1, -1.0f, 1.0f);
  ops::fill_uniform(proj, 2, -0.5f, 0.5f);
  ops::fill_uniform(conv, 3, -0.5f, 0.5f);
  ops::fill_uniform(neg_a, 4, -1.0f, -0.1f);
  ops::fill_uniform(dt_bias, 5, -0.5f, 0.5f);
  ops::fill_uniform(norm, 6, 0.5f, 1.5f);
  Tensor starts = Tensor::empty({2}, DType::kI32), slots = Tensor::empty({1}, DType::kI32);
  starts.ptr<int32_t>()[1] = 1;
  struct Run {
    Tensor fused, conv_states, states, out;
  };
  auto fresh = [&] {
    Run r{Tensor::empty({1, width}, DType::kF32), Tensor::empty({1, C, W - 1}, DType::kF32),
          Tensor::empty({1, Hv, Dk, Dv}, DType::kF32), Tensor::empty({1, Hv * Dv}, DType::kF32)};
    ops::fill_uniform(r.conv_states, 7, -1.0f, 1.0f);
    ops::fill_uniform(r.states, 8, -0.1f, 0.1f);
    return r;
  };
  const ops::GdnWeights w{&proj, &conv, &neg_a, &dt_bias, &norm, 1e-6f};
  Run a = fresh(), b = fresh();
  ops::gdn_decode(&x, a.fused, w, a.conv_states, a.states, starts, slots, a.out);
  ops::linear(x, proj, nullptr, b.fused);
  ops::gdn_decode(nullptr, b.fused, w, b.conv_states, b.states, starts, slots, b.out);
  auto same = [](const Tensor& p, const Tensor& q) { return std::memcmp(p.data(), q.data(), p.nbytes()) == 0; };
  EXPECT(same(a.fused, b.fused) && same(a.out, b.out) && same(a.states, b.states) && same(a.conv_states, b.conv_states));
  float norm1 = 0.0f;  // the step did something: not all zero
  for (int64_t i = 0; i < a.out.numel(); ++i) norm1 += std::fabs(a.out.ptr<float>()[i]);
  EXPECT(norm1 > 0.0f);
  ops::GdnWeights no_proj = w;
  no_proj.proj = nullptr;
  Run c = fresh();
  EXPECT(throws_naming([&] { ops::gdn_decode(&x, c.fused, no_proj, c.conv_states, c.states, starts, slots, c.out); },
                       "GdnWeights::proj"));
  Tensor narrow = Tensor::empty({1, H / 2}, DType::kF32);  // an input the projection does not take
  EXPECT(throws_naming([&] { ops::gdn_decode(&narrow, c.fused, w, c.conv_states, c.states, starts, slots, c.out); },
                       "x [T, hidden]"));
}

// moe_route given a block's output (ResidualNorm first): the same residual, normed rows, ids and
// weights as add_rms_norm followed by moe_route of the normed rows; a residual of another shape
// is refused, naming it.
void test_moe_route_after_add_norm() {
  const int64_t T = 2, H = 16, E = 8, K = 3;
  Tensor y = Tensor::empty({T, H}, DType::kF32), router = Tensor::empty({E + 1, H}, DType::kF32);
  Tensor w = Tensor::empty({H}, DType::kF32), res0 = Tensor::empty({T, H}, DType::kF32);
  ops::fill_uniform(y, 11, -1.0f, 1.0f);
  ops::fill_uniform(router, 12, -0.5f, 0.5f);
  ops::fill_uniform(w, 13, 0.5f, 1.5f);
  ops::fill_uniform(res0, 14, -1.0f, 1.0f);
  struct Run {
    Tensor residual, normed, ids, weights;
  };
  auto fresh = [&] {
    Run r{Tensor::empty({T, H}, DType::kF32), Tensor::empty({T, H}, DType::kF32), Tensor::empty({T, K + 1}, DType::kI32),
          Tensor::empty({T, K + 1}, DType::kF32)};
    std::memcpy(r.residual.data(), res0.data(), res0.nbytes());
    return r;
  };
  Run a = fresh(), b = fresh();
  const ops::ResidualNorm first{&a.residual, &w, 1e-6f, &a.normed};
  ops::moe_route(y, router, E, true, a.ids, a.weights, &first);
  ops::add_rms_norm(b.residual, y, w, 1e-6f, b.normed);
  ops::moe_route(b.normed, router, E, true, b.ids, b.weights);
  auto same = [](const Tensor& p, const Tensor& q) { return std::memcmp(p.data(), q.data(), p.nbytes()) == 0; };
  EXPECT(same(a.residual, b.residual) && same(a.normed, b.normed) && same(a.ids, b.ids) && same(a.weights, b.weights));
  EXPECT(!same(a.residual, res0));  // the add happened
  Tensor short_res = Tensor::empty({T, H / 2}, DType::kF32);
  Run c = fresh();
  const ops::ResidualNorm bad{&short_res, &w, 1e-6f, &c.normed};
  EXPECT(throws_naming([&] { ops::moe_route(y, router, E, true, c.ids, c.weights, &bad); }, "residual"));
}

}  // namespace


// A safetensors file of a float32 [6, 8] "a" (value 100 r + c) and a float16 [4, 8] "b" (r + c / 8):
// rows and columns cut from either, stacked parts cut differently, converted on the way, and the
// made-up weights of load_format dummy cut as the whole tensor would be.
void test_sliced_loads() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "revolta-slices";
  fs::create_directories(dir);
  std::vector<float> a(48);
  std::vector<uint16_t> b(32);
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 8; ++c) a[size_t(r * 8 + c)] = float(100 * r + c);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 8; ++c) {
      const float v = float(r) + float(c) / 8.0f;
      convert_from_f32(&v, &b[size_t(r * 8 + c)], DType::kF16, 1);
    }
  const std::string header = R"({"a":{"dtype":"F32","shape":[6,8],"data_offsets":[0,192]},)"
                             R"("b":{"dtype":"F16","shape":[4,8],"data_offsets":[192,256]}})";
  {
    std::ofstream f(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8).write(header.data(), std::streamsize(n));
    f.write(reinterpret_cast<const char*>(a.data()), 192).write(reinterpret_cast<const char*>(b.data()), 64);
  }
  WeightLoader w(dir.string());
  auto at = [](const Tensor& t, int64_t r, int64_t c) { return t.ptr<float>()[r * t.size(1) + c]; };
  Tensor rows = w.get_sliced({"a"}, {{6, 8}}, {Slice::rows(2, 5)}, DType::kF32, true);
  EXPECT(rows.size(0) == 3 && rows.size(1) == 8 && at(rows, 0, 0) == 200.0f && at(rows, 2, 7) == 407.0f);
  Tensor cols = w.get_sliced({"a"}, {{6, 8}}, {Slice::cols(4, 8)}, DType::kF32, true);
  EXPECT(cols.size(0) == 6 && cols.size(1) == 4 && at(cols, 0, 0) == 4.0f && at(cols, 5, 3) == 507.0f);
  Tensor stacked = w.get_sliced({"a", "b"}, {{6, 8}, {4, 8}}, {Slice::rows(1, 3), Slice::rows(2, 4)}, DType::kF32, true);
  EXPECT(stacked.size(0) == 4 && at(stacked, 1, 1) == 201.0f && at(stacked, 2, 0) == 2.0f && at(stacked, 3, 4) == 3.5f);
  Tensor both = w.get_sliced({"a", "b"}, {{6, 8}, {4, 8}}, {Slice::cols(2, 4), Slice::cols(2, 4)}, DType::kF32, true);
  EXPECT(both.size(0) == 10 && both.size(1) == 2 && at(both, 5, 1) == 503.0f && at(both, 9, 0) == 3.25f);
  EXPECT(throws_naming([&] { w.get_sliced({"a"}, {{6, 8}}, {Slice::rows(4, 7)}, DType::kF32, true); }, "'a'"));
  EXPECT(throws_naming([&] { w.get_sliced({"a", "b"}, {{6, 8}, {4, 8}}, {Slice::cols(0, 4), Slice::cols(0, 2)}, DType::kF32, true); },
                       "row width"));
  WeightLoader dummy(dir.string(), Device::kCPU, /*dummy=*/true);
  Tensor whole = dummy.get_linear("m", {16, 12}, DType::kF32);
  Tensor part = dummy.get_sliced({"m"}, {{16, 12}}, {Slice::cols(3, 9)}, DType::kF32, true);
  bool same = part.size(0) == 16 && part.size(1) == 6;
  for (int64_t r = 0; same && r < 16; ++r)
    for (int64_t c = 0; c < 6; ++c) same = same && at(part, r, c) == at(whole, r, c + 3);
  EXPECT(same);
  fs::remove_all(dir);
}

// Every float16 bit pattern against the format's definition: (-1)^s 2^(e-15) (1 + m/1024), e = 0
// subnormal m 2^-24, e = 31 infinity (m = 0) or NaN.
void test_f16_conversion_of_every_value() {
  int wrong = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const int e = int(h >> 10) & 31, m = int(h & 1023);
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const float got = f16_to_f32(uint16_t(h));
    if (e == 31) {
      wrong += m == 0 ? !(std::isinf(got) && (got < 0) == (sign < 0)) : !std::isnan(got);
      continue;
    }
    const double want = sign * (e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + m / 1024.0, e - 15));
    wrong += double(got) != want || std::signbit(got) != (sign < 0);
  }
  EXPECT(wrong == 0);
}

void run_weight_layout_tests() {
  test_f16_conversion_of_every_value();
  test_sliced_loads();
  test_transpose_definition();
  test_transpose_rejects_mismatched_shapes();
  test_cpu_experts_refuse_transposed_down();
  test_experts_held_elsewhere_add_nothing();
  test_gdn_decode_from_input();
  test_moe_route_after_add_norm();
}
