// Row gathers, column copies, transposes, random fills and argmax: the small ops that keep model code free
// of raw memory access, so the same forward runs on every device.
#include <cstring>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {

void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int64_t R = rows.numel(), C = out.numel() / std::max<int64_t>(R, 1), N = x.numel() / std::max<int64_t>(C, 1);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t src = rows.ptr<int32_t>()[r];
    RV_CHECK(src >= 0 && src < N, "gather_rows: row ", src, " out of range [0, ", N, ")");
    std::memcpy(out.ptr<float>() + r * C, x.ptr<float>() + int64_t(src) * C, size_t(C) * 4);
  }
}

void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst) {
  const int64_t T = src.size(0), SC = src.numel() / std::max<int64_t>(T, 1), DC = dst.numel() / std::max<int64_t>(T, 1);
  RV_CHECK(first_column + DC <= SC, "copy_columns: columns [", first_column, ", ", first_column + DC, ") of ", SC);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(dst.ptr<float>() + t * DC, src.ptr<float>() + t * SC + first_column, size_t(DC) * 4);
}

void transpose(const Tensor& x, Tensor& out) {
  const int64_t R = x.size(0), C = x.size(1), es = int64_t(dtype_size(x.dtype()));
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(out.data());
  constexpr int64_t kTile = 64;  // tiles keep both sides' cache lines in use
  for (int64_t r0 = 0; r0 < R; r0 += kTile)
    for (int64_t c0 = 0; c0 < C; c0 += kTile)
      for (int64_t r = r0; r < std::min(R, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + kTile); ++c)
          std::memcpy(dst + (c * R + r) * es, src + (r * C + c) * es, size_t(es));
}

void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& at) {
  const int64_t n = t.numel(), cols = t.dim() >= 2 ? n / t.size(0) : n;
  const DType dt = t.dtype();
  parallel_range(n, 1 << 16, [&](int64_t b, int64_t e) {
    float buf[256];
    for (int64_t i = b; i < e; i += 256) {
      const int64_t m = std::min<int64_t>(256, e - i);
      for (int64_t j = 0; j < m; ++j) buf[j] = lo + (hi - lo) * uniform_at(seed, uint64_t(at.index(i + j, cols)));
      convert_from_f32(buf, static_cast<char*>(t.data()) + i * int64_t(dtype_size(dt)), dt, size_t(m));
    }
  });
}

void argmax(const Tensor& x, Tensor& out) {
  const int64_t R = out.numel(), V = x.numel() / std::max<int64_t>(R, 1);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x.ptr<float>() + r * V;
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = int32_t(v);
    out.ptr<int32_t>()[r] = best;
  }
}

}  // namespace revolta::ops::cpu
