// revolta._core.ops: selected CPU ops on float32 numpy arrays, so tests can hold each op against
// an independent reference (HF transformers' torch code, naive recurrences).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/cpu/blocks/block_dots.h"
#include "ops/cpu/cpu_ops.h"
#include "model/vision_encoder.h"
#include "spec/dflash_model.h"
#include "quant/int4_groups.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace revolta;

using F32Array = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using U8Array = nb::ndarray<uint8_t, nb::c_contig, nb::device::cpu>;
using I32Array = nb::ndarray<int32_t, nb::c_contig, nb::device::cpu>;

namespace {

Tensor wrap(const F32Array& a) {
  std::vector<int64_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
  return Tensor::wrap(const_cast<float*>(a.data()), shape, DType::kF32, nullptr);
}

nb::ndarray<nb::numpy, float, nb::ndim<2>> to_numpy(const Tensor& t) {
  float* data = new float[size_t(t.numel())];
  std::copy_n(t.ptr<float>(), t.numel(), data);
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return nb::ndarray<nb::numpy, float, nb::ndim<2>>(data, {size_t(t.size(0)), size_t(t.size(1))}, owner);
}

// One DFlash draft forward for one request on a fresh cache: C context rows at positions [0, C),
// the block at [C, C + B), every block row seeing all of them (the engine's attention layout).
nb::dict dflash_draft(const std::string& dir, F32Array context, F32Array noise, F32Array lm_head, int32_t anchor,
                      float temperature, const std::vector<float>& uniforms) {
  const DFlashConfig c = DFlashConfig::from_dir(dir);
  const int32_t C = int32_t(context.shape(0)), B = int32_t(noise.shape(0)), bs = 16;
  const int32_t blocks = (C + B + bs - 1) / bs;
  DFlashDraft draft(WeightLoader(dir), c, C + B + 1, DType::kF32, Device::kCPU);
  KvCache kv({draft.num_layers(), c.layers.num_kv_heads, c.layers.head_dim, DType::kF32}, blocks, bs);
  const auto ints = [](int32_t n, int32_t first) {
    Tensor t = Tensor::empty({n}, DType::kI32);
    for (int32_t i = 0; i < n; ++i) t.ptr<int32_t>()[i] = first + i;
    return t;
  };
  DFlashInputs in;
  in.context = wrap(context), in.noise = wrap(noise);
  in.context_positions = in.context_slots = ints(C, 0);
  in.block_positions = in.block_slots = ints(B, C);
  in.first_row = Tensor::empty({B}, DType::kI32);
  std::vector<int32_t> query_start(size_t(B) + 1), lens(size_t(B), C + B), tables;
  std::iota(query_start.begin(), query_start.end(), 0);
  for (int32_t r = 0; r < B; ++r)
    for (int32_t b = 0; b < blocks; ++b) tables.push_back(b);
  in.attention = {query_start.data(), lens.data(), tables.data(), B, blocks, bs};
  in.attention.max_seq_len = C + B;
  nb::dict out;
  Tensor hidden, logits;
  DFlashPath path;
  {
    nb::gil_scoped_release release;
    hidden = draft.forward(in, kv, 0);
    logits = draft.logits(hidden, wrap(lm_head));
    if (c.dflash2()) path = draft.select(hidden.slice_rows(1, B), logits.slice_rows(1, B), anchor, temperature, uniforms);
  }
  out["hidden"] = to_numpy(hidden);
  out["logits"] = to_numpy(logits);
  out["tokens"] = path.tokens;
  out["candidates"] = path.candidates;
  out["q"] = path.q;
  return out;
}

}  // namespace

void bind_ops(nb::module_& m) {
  auto ops = m.def_submodule("ops", "CPU ops on float32 numpy arrays (for tests)");
  ops.def("block_kernels_isa", [] { return std::string(ops::cpu::block_kernels().isa); },
          "The instruction set of the CPU block-dot kernels this process picked (REVOLTA_CPU_ISA may lower it).");
  // Quantized weights: raw blocks [N, bytes per row] of the named block type (q4_0, q4_k, ...).
  auto blocks = [](const U8Array& raw, const std::string& dtype, int64_t K) {
    const DType t = parse_dtype(dtype);
    RV_CHECK(raw.ndim() == 2 && int64_t(raw.shape(1)) == dtype_bytes(t, K), "raw blocks [N, ", dtype_bytes(t, K),
             "] expected for K = ", K);
    return Tensor::wrap(const_cast<uint8_t*>(raw.data()), {int64_t(raw.shape(0)), K}, t, nullptr);
  };
  ops.def(
      "linear_quantized",
      [blocks](F32Array x, U8Array raw, const std::string& dtype, F32Array out, int activation_bits) {
        RV_CHECK_ARG(activation_bits == 8 || activation_bits == 16, "activation_bits must be 8 or 16");
        Tensor o = wrap(out);
        const Tensor w = blocks(raw, dtype, int64_t(x.shape(x.ndim() - 1)));
        nb::gil_scoped_release release;
        const int before = ops::cpu_block_activation_bits();
        ops::set_cpu_block_activation_bits(activation_bits);
        ops::cpu::linear(wrap(x), w, nullptr, o);
        ops::set_cpu_block_activation_bits(before);
      },
      "x"_a, "raw"_a, "dtype"_a, "out"_a, "activation_bits"_a = 16,
      "out[M, N] = x[M, K] . dequantized(raw)^T (decode-sized M: x in 8- or 16-bit blocks)");
  ops.def(
      "repack_awq",
      [](I32Array qweight, I32Array qzeros, nb::ndarray<uint16_t, nb::c_contig, nb::device::cpu> scales) {
        RV_CHECK(qweight.ndim() == 2 && qzeros.ndim() == 2 && scales.ndim() == 2, "repack_awq: 2-D tensors expected");
        const int64_t K = int64_t(qweight.shape(0)), N = int64_t(qweight.shape(1)) * 8, groups = int64_t(scales.shape(0));
        RV_CHECK(groups > 0 && K % groups == 0 && int64_t(scales.shape(1)) == N && int64_t(qzeros.shape(0)) == groups &&
                     int64_t(qzeros.shape(1)) == N / 8,
                 "repack_awq: qweight [K, N/8], qzeros [K/g, N/8], scales [K/g, N] expected");
        const DType t = int4_group_dtype(K / groups, "repack_awq");
        auto* raw = new uint8_t[size_t(dtype_bytes(t, N * K))];
        repack_awq(qweight.data(), qzeros.data(), scales.data(), N, K, K / groups, raw);
        nb::capsule owner(raw, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
        return std::make_pair(nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(raw, {size_t(N), size_t(dtype_bytes(t, K))}, owner),
                              std::string(dtype_name(t)));
      },
      "qweight"_a, "qzeros"_a, "scales"_a,
      "AutoAWQ GEMM tensors (scales as float16 bits) -> (raw int4 blocks [N, bytes per row], dtype name)");
  ops.def(
      "embedding_quantized",
      [blocks](I32Array ids, U8Array raw, const std::string& dtype, F32Array out) {
        Tensor o = wrap(out);
        const Tensor table = blocks(raw, dtype, int64_t(out.shape(out.ndim() - 1)));
        const Tensor t = Tensor::wrap(const_cast<int32_t*>(ids.data()), {int64_t(ids.size())}, DType::kI32, nullptr);
        ops::cpu::embedding(t, table, o, nullptr);
      },
      "ids"_a, "raw"_a, "dtype"_a, "out"_a, "out[T, K] = dequantized(raw)[ids]");
  ops.def(
      "paged_attention_cached",
      [](F32Array q, F32Array k, F32Array v, const std::string& kv_dtype, float k_scale, float v_scale, int block_size,
         F32Array out) {
        const int64_t T = int64_t(q.shape(0)), S = int64_t(k.shape(0)), KVH = int64_t(k.shape(1)), D = int64_t(k.shape(2));
        RV_CHECK(q.ndim() == 3 && k.ndim() == 3 && T <= S && block_size > 0, "q [T, H, D], k / v [S, kv_heads, D], T <= S");
        const DType t = parse_dtype(kv_dtype);
        const int32_t blocks = int32_t((S + block_size - 1) / block_size);
        Tensor kc = Tensor::empty({blocks, block_size, KVH, D}, t), vc = Tensor::empty({blocks, block_size, KVH, D}, t);
        ops::KvQuant quant{k_scale, v_scale};
        if (t == DType::kI8)
          quant.k_rows = Tensor::empty({blocks, block_size, KVH}, DType::kF32),
          quant.v_rows = Tensor::empty({blocks, block_size, KVH}, DType::kF32);
        const ops::KvQuant* qp = t == DType::kF8E4M3 || t == DType::kI8 ? &quant : nullptr;
        std::vector<int32_t> table(static_cast<size_t>(blocks)), slots(static_cast<size_t>(S));
        for (int32_t b = 0; b < blocks; ++b) table[size_t(b)] = blocks - 1 - b;  // blocks in reverse order
        for (int64_t p = 0; p < S; ++p) slots[size_t(p)] = table[size_t(p / block_size)] * block_size + int32_t(p % block_size);
        const Tensor sm = Tensor::wrap(slots.data(), {S}, DType::kI32, nullptr);
        ops::cpu::kv_cache_write(wrap(k), wrap(v), sm, kc, vc, qp);
        const int32_t starts[2] = {0, int32_t(T)}, lens[1] = {int32_t(S)};
        ops::AttentionBatch b;
        b.query_start = starts, b.seq_lens = lens, b.block_tables = table.data(), b.num_seqs = 1;
        b.max_blocks_per_seq = blocks, b.block_size = block_size, b.max_seq_len = int32_t(S);
        Tensor o = wrap(out);
        ops::cpu::paged_attention(wrap(q), kc, vc, b, 1.0f / std::sqrt(float(D)), o, nullptr, qp);
      },
      "q"_a, "k"_a, "v"_a, "kv_dtype"_a, "k_scale"_a, "v_scale"_a, "block_size"_a, "out"_a,
      "Causal attention of q (the last T of S positions) over k / v written to a paged cache of kv_dtype "
      "(float32, float16, float8_e4m3 with the scales, int8) and read back from it");
  ops.def(
      "gated_delta_rule",
      [](F32Array q, F32Array k, F32Array v, F32Array g, F32Array beta, F32Array state, F32Array out, int chunk_size) {
        Tensor s = wrap(state), o = wrap(out);
        nb::gil_scoped_release release;
        ops::cpu::gated_delta_rule(wrap(q), wrap(k), wrap(v), wrap(g), wrap(beta), s, o, chunk_size);
      },
      "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "state"_a, "out"_a, "chunk_size"_a,
      "q, k: [T, Hk, Dk]; v: [T, Hv, Dv]; g, beta: [T, Hv]; state: [Hv, Dk, Dv] (updated); out: [T, Hv, Dv]");
  ops.def(
      "causal_conv1d",
      [](F32Array x, F32Array weight, F32Array state, F32Array out, bool silu) {
        Tensor s = wrap(state), o = wrap(out);
        ops::cpu::causal_conv1d(wrap(x), wrap(weight), s, o, silu);
      },
      "x"_a, "weight"_a, "state"_a, "out"_a, "silu"_a);
  ops.def(
      "l2_norm", [](F32Array x, int64_t dim, float eps) {
        Tensor t = wrap(x);
        ops::cpu::l2_norm(t, dim, eps);
      },
      "x"_a, "dim"_a, "eps"_a);
  ops.def(
      "gated_rms_norm",
      [](F32Array x, F32Array gate, F32Array weight, float eps, F32Array out, int64_t gate_column) {
        Tensor o = wrap(out);
        ops::cpu::gated_rms_norm(wrap(x), wrap(gate), gate_column, wrap(weight), eps, o);
      },
      "x"_a, "gate"_a, "weight"_a, "eps"_a, "out"_a, "gate_column"_a = 0);
  ops.def(
      "vision_encode",
      [](const std::string& model_dir, F32Array pixels, const std::vector<std::tuple<int, int, int>>& grids) {
        const ModelConfig c = ModelConfig::from_file(model_dir + "/config.json");
        RV_CHECK_ARG(c.vision.depth > 0, model_dir, " has no vision_config");
        WeightLoader w(model_dir);
        VisionEncoder enc(w, c.vision, DType::kF32, Device::kCPU);
        std::vector<VisionItem> items;
        int64_t at = 0;
        for (auto [t, h, wd] : grids) {
          items.push_back({pixels.data() + at * c.vision.patch_dim(), t, h, wd});
          at += int64_t(t) * h * wd;
        }
        RV_CHECK_ARG(at == int64_t(pixels.shape(0)), "the grids cover ", at, " patches; pixels has ", pixels.shape(0));
        Tensor out;
        {
          nb::gil_scoped_release release;
          out = enc.encode(items);
        }
        return to_numpy(out);
      },
      "model_dir"_a, "pixels"_a, "grids"_a,
      "The checkpoint's vision tower over patches [N, patch_dim] of (t, h, w) grids: merged tokens, float32");
  ops.def("dflash_draft", &dflash_draft, "draft_dir"_a, "context"_a, "noise"_a, "lm_head"_a, "anchor"_a = 0,
          "temperature"_a = 0.0f, "uniforms"_a = std::vector<float>{},
          "A DFlash / DFlash2 draft over target features context [C, taps * hidden] and block embeddings noise "
          "[B, hidden] (anchor first): {hidden [B, hidden], logits [B, vocab], and DFlash2's selector path over the "
          "mask rows: tokens, candidates, q}");
}
