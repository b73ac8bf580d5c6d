// The CPU linear layer over weights kept in 32-value blocks (Q4_0, Q4_1, Q8_0; the K formats' sub-blocks) with integer dot
// products: each input row is quantized once to 8-bit blocks (a scale per 32 values, plus the
// block's sum for Q4_1's minimum), then every weight block meets its input block in
// 32 int8 x int8 products summed in int32 (blocks/block_dots.inc: AVX2 maddubs / madd, or VNNI),
// scaled by both blocks' scales. The weights are read once, as stored, and never widened to float.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/blocks/block_dots.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {
namespace {

constexpr int64_t kBlock = 32;

// An input row in 8-bit blocks.
struct QuantizedRow {
  std::vector<int8_t> q;      // K values
  std::vector<float> scale;   // K / 32 scales: x ~ q * scale
  // K / 32 sums of each block's quantized values (times its scale): Q4_1's minimum must meet the
  // same x as its values, or their errors stop cancelling (the exact float sum tripled the error
  // of SmolLM2's projections: 2.4% against 0.7%).
  std::vector<float> sum;
  std::vector<int8_t> lo;  // 16-bit activations: each value's rounding residual, times 254
  BlockRow view(bool fine) const { return {q.data(), fine ? lo.data() : nullptr, scale.data(), sum.data()}; }
};

void quantize_row(const float* x, int64_t K, bool fine, QuantizedRow& r) {
  r.q.resize(size_t(K));
  if (fine) r.lo.resize(size_t(K));
  r.scale.resize(size_t(K / kBlock));
  r.sum.resize(size_t(K / kBlock));
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const float* v = x + b * kBlock;
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0, residuals = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      const float u = v[j] * inv;
      const int8_t q = int8_t(std::lrintf(u));
      r.q[size_t(b * kBlock + j)] = q;
      sum += q;
      if (fine) {
        const int8_t lo = int8_t(std::lrintf((u - float(q)) * 254.0f));
        r.lo[size_t(b * kBlock + j)] = lo;
        residuals += lo;
      }
    }
    r.scale[size_t(b)] = fine ? d / 254.0f : d;  // (the kernels' dots then count in residual steps)
    r.sum[size_t(b)] = d * (float(sum) + float(residuals) / 254.0f);
  }
}

BlockKernels pick_block_kernels() {
  std::vector<BlockKernels> have;  // best first
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    have.push_back({"avx512-vnni", &block_dots_avx512vnni});
  if (avx2 && __builtin_cpu_supports("avxvnni")) have.push_back({"avx-vnni", &block_dots_avxvnni});
  if (avx2) have.push_back({"avx2", &block_dots_avx2});
#endif
  have.push_back({"none", nullptr});
  const char* asked = std::getenv("REVOLTA_CPU_ISA");
  if (!asked || !*asked) return have.front();
  std::string names;
  for (const BlockKernels& k : have) {
    if (asked == std::string(k.isa)) return k;
    names += std::string(names.empty() ? "" : ", ") + k.isa;
  }
  throw std::invalid_argument(str_cat("REVOLTA_CPU_ISA '", asked, "': this processor runs ", names));
}

}  // namespace

const BlockKernels& block_kernels() {
  static const BlockKernels kernels = pick_block_kernels();
  return kernels;
}

bool linear_blocks_int8(const float* x, int64_t M, int64_t K, const Tensor& w, int64_t N, float* out) {
  const DType t = w.dtype();
  const BlockDots dots = block_kernels().dots;
  const bool integer_dots = t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ4_K ||
                            t == DType::kQ5_K || t == DType::kQ6_K;
  if (!dots || !integer_dots || K % dtype_block_values(t))
    return false;
  // Reused by the calling thread (the workers see it through this reference, not their own copy).
  const bool fine = cpu_block_activation_bits() == 16;
  thread_local std::vector<QuantizedRow> buffers;
  std::vector<QuantizedRow>& rows = buffers;
  rows.resize(size_t(M));
  std::vector<BlockRow> views(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) quantize_row(x + m * K, K, fine, rows[size_t(m)]), views[size_t(m)] = rows[size_t(m)].view(fine);
  const int64_t row_bytes = dtype_bytes(t, K), blocks = K / kBlock, per_task = 16;
  const auto* base = static_cast<const uint8_t*>(w.data());
  parallel_tasks((N + per_task - 1) / per_task, [&](int64_t task) {
    const int64_t n1 = std::min(N, (task + 1) * per_task);
    for (int64_t n = task * per_task; n < n1; ++n)
      for (int64_t m = 0; m < M; m += 4) {  // input rows four at a time
        float d[4];
        const int r = int(std::min<int64_t>(4, M - m));
        dots(t, base + n * row_bytes, views.data() + m, r, blocks, d);
        for (int i = 0; i < r; ++i) out[(m + i) * N + n] = d[i];
      }
  });
  return true;
}

}  // namespace revolta::ops::cpu
