// DFlash2's grouped dynamic causal conv on the CPU (the contract is in ops.h): each row's channels
// are mixed with their own earlier rows in the same draft block, by a static kernel per channel plus
// a dynamic one per channel group that the row itself projected.
#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {

void dynamic_conv(const Tensor& x, const Tensor& dynamic, int64_t column, int64_t groups, const Tensor& base,
                  const Tensor& first_row, Tensor& out) {
  const int64_t R = x.size(0), C = x.size(1), K = base.size(0), width = C / groups, stride = dynamic.size(1);
  const float* xp = x.ptr<float>();
  const float* dp = dynamic.ptr<float>();
  const float* bp = base.ptr<float>();
  const int32_t* first = first_row.ptr<int32_t>();
  float* op = out.ptr<float>();
  parallel_range(R, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* o = op + r * C;
      for (int64_t c = 0; c < C; ++c) o[c] = 0.0f;
      for (int64_t t = 0; t < K && r - t >= first[r]; ++t) {
        const float* src = xp + (r - t) * C;
        const float* kernel = bp + t * C;
        const float* dyn = dp + r * stride + column + t * groups;
        for (int64_t c = 0; c < C; ++c) o[c] += (kernel[c] + dyn[c / width]) * src[c];
      }
    }
  });
}

}  // namespace revolta::ops::cpu
