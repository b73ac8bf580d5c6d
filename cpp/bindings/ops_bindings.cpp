// revolta._core.ops: selected CPU ops on float32 numpy arrays, so tests can hold each op against
// an independent reference (HF transformers' torch code, naive recurrences).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace revolta;

using F32Array = nb::ndarray<float, nb::c_contig, nb::device::cpu>;

namespace {

Tensor wrap(const F32Array& a) {
  std::vector<int64_t> shape;
  for (size_t i = 0; i < a.ndim(); ++i) shape.push_back(int64_t(a.shape(i)));
  return Tensor::wrap(const_cast<float*>(a.data()), shape, DType::kF32, nullptr);
}

}  // namespace

void bind_ops(nb::module_& m) {
  auto ops = m.def_submodule("ops", "CPU ops on float32 numpy arrays (for tests)");
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
