// revolta._core.gguf: a GGUF file's tensors as the C++ reader sees them, and their dequantization,
// so tests can hold both against the `gguf` package.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "quant/gguf_blocks.h"
#include "quant/gguf_file.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace revolta;

void bind_gguf(nb::module_& m) {
  auto g = m.def_submodule("gguf", "GGUF files read by the engine's own reader (for tests)");
  g.def(
      "tensors",
      [](const std::string& path) {
        GgufFile f(path);
        std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, int64_t>> out;
        for (const GgufTensor& t : f.tensors()) out.emplace_back(t.name, gguf_type_name(t.type), t.shape, t.nbytes);
        return out;
      },
      "path"_a, "(name, type, row-major shape, bytes) of every tensor");
  g.def(
      "dequantize",
      [](const std::string& path, const std::string& name) {
        GgufFile f(path);
        const GgufTensor* t = f.find(name);
        if (!t) throw nb::key_error(("no tensor '" + name + "' in " + path).c_str());
        int64_t n = 1;
        for (int64_t d : t->shape) n *= d;
        float* data = new float[size_t(n)];
        nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        {
          nb::gil_scoped_release release;
          dequantize(dtype_of_gguf(t->type), t->data, data, n);
        }
        std::vector<size_t> shape(t->shape.begin(), t->shape.end());
        return nb::ndarray<nb::numpy, float>(data, shape.size(), shape.data(), owner);
      },
      "path"_a, "name"_a, "the tensor as float32, row-major");
}
