// revolta._core.ops: selected CPU ops on float32 numpy arrays, so tests can hold each op against
// an independent reference (HF transformers' torch code, naive recurrences).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <vector>

#include "core/error.h"
#include "ops/cpu/blocks/block_dots.h"
#include "ops/cpu/cpu_ops.h"
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
      [blocks](F32Array x, U8Array raw, const std::string& dtype, F32Array out) {
        Tensor o = wrap(out);
        const Tensor w = blocks(raw, dtype, int64_t(x.shape(x.ndim() - 1)));
        nb::gil_scoped_release release;
        ops::cpu::linear(wrap(x), w, nullptr, o);
      },
      "x"_a, "raw"_a, "dtype"_a, "out"_a, "out[M, N] = x[M, K] . dequantized(raw)^T");
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
}
