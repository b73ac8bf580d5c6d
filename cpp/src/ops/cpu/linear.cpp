// Dense linear layer on the CPU: out[M, N] = x[M, K] . W[N, K]^T with f32/f16/bf16 weights and
// f32 accumulation. Work is split over blocks of output features so that each thread streams
// its own slice of W once; for batched inputs a block of W is first widened to f32 in a
// thread-local buffer so the conversion is paid once per weight, not once per input row.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"

namespace revolta::ops::cpu {
namespace {

constexpr int64_t kRowsPerTask = 16;
constexpr int64_t kMaxTileRows = 4;

// MR input rows x NR weight rows of dot products over K.
template <int MR, int NR, typename W>
void dot_tile(const float* x, int64_t ldx, const typename W::T* w, int64_t ldw, int64_t K,
              float* out, int64_t ldo) {
  int64_t k = 0;
  float res[MR][NR] = {};
#if RV_AVX2
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = load8(W{}, w + n * ldw + k);
    for (int m = 0; m < MR; ++m) {
      __m256 xv = load8(x + m * ldx + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) res[m][n] = hsum(acc[m][n]);
#endif
  for (; k < K; ++k)
    for (int n = 0; n < NR; ++n) {
      float wk = W::scalar(w + n * ldw + k);
      for (int m = 0; m < MR; ++m) res[m][n] += x[m * ldx + k] * wk;
    }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) out[m * ldo + n] = res[m][n];
}

template <typename W, int MR>
void dot_tile_nr(int nr, const float* x, int64_t ldx, const typename W::T* w, int64_t ldw,
                 int64_t K, float* out, int64_t ldo) {
  switch (nr) {
    case 1: return dot_tile<MR, 1, W>(x, ldx, w, ldw, K, out, ldo);
    case 2: return dot_tile<MR, 2, W>(x, ldx, w, ldw, K, out, ldo);
    case 3: return dot_tile<MR, 3, W>(x, ldx, w, ldw, K, out, ldo);
    default: return dot_tile<MR, 4, W>(x, ldx, w, ldw, K, out, ldo);
  }
}

template <typename W>
void dot_tile_any(int mr, int nr, const float* x, int64_t ldx, const typename W::T* w, int64_t ldw,
                  int64_t K, float* out, int64_t ldo) {
  switch (mr) {
    case 1: return dot_tile_nr<W, 1>(nr, x, ldx, w, ldw, K, out, ldo);
    case 2: return dot_tile_nr<W, 2>(nr, x, ldx, w, ldw, K, out, ldo);
    case 3: return dot_tile_nr<W, 3>(nr, x, ldx, w, ldw, K, out, ldo);
    default: return dot_tile_nr<W, 4>(nr, x, ldx, w, ldw, K, out, ldo);
  }
}

// Rows [n0, n1) of W against all M input rows.
template <typename W>
void linear_block(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t n0,
                  int64_t n1, float* out, int64_t N) {
  // Decode-sized M: 4 weight rows share each loaded input vector.
  // Prefill-sized M: 4 input rows x 2 weight rows per tile keeps all accumulators in registers.
  const int nr_max = M <= 2 ? 4 : 2;
  for (int64_t m = 0; m < M; m += kMaxTileRows) {
    int mr = int(std::min<int64_t>(kMaxTileRows, M - m));
    for (int64_t n = n0; n < n1; n += nr_max) {
      int nr = int(std::min<int64_t>(nr_max, n1 - n));
      dot_tile_any<W>(mr, nr, x + m * K, K, w + n * K, K, K, out + m * N + n, N);
    }
  }
}

template <typename W>
void linear_typed(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t N,
                  float* out) {
  int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  auto run = [&](int64_t t) {
    int64_t n0 = t * kRowsPerTask, n1 = std::min(N, n0 + kRowsPerTask);
    if constexpr (!std::is_same_v<W, F32W>) {
      if (M >= 8) {
        thread_local std::vector<float> wide;
        wide.resize(size_t((n1 - n0) * K));
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t k = 0; k < K; ++k) wide[size_t((n - n0) * K + k)] = W::scalar(w + n * K + k);
        linear_block<F32W>(x, M, K, wide.data(), 0, n1 - n0, out + n0, N);
        return;
      }
    }
    linear_block<W>(x, M, K, w, n0, n1, out, N);
  };
  if (ThreadPool* pool = cpu_thread_pool()) pool->parallel_for(tasks, run);
  else
    for (int64_t t = 0; t < tasks; ++t) run(t);
}

}  // namespace

void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  RV_CHECK(x.dtype() == DType::kF32 && out.dtype() == DType::kF32, "linear: activations must be f32");
  RV_CHECK(weight.dim() == 2 && x.is_contiguous() && out.is_contiguous() && weight.is_contiguous(),
           "linear: bad layout");
  const int64_t K = weight.size(1), N = weight.size(0);
  const int64_t M = x.numel() / K;
  RV_CHECK(x.size(-1) == K && out.numel() == M * N, "linear: x ", x.shape_str(), " weight ",
           weight.shape_str(), " out ", out.shape_str());
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  switch (weight.dtype()) {
    case DType::kF32: linear_typed<F32W>(xp, M, K, weight.ptr<float>(), N, op); break;
    case DType::kF16: linear_typed<F16W>(xp, M, K, weight.ptr<uint16_t>(), N, op); break;
    case DType::kBF16: linear_typed<BF16W>(xp, M, K, weight.ptr<uint16_t>(), N, op); break;
    default: throw std::invalid_argument(str_cat("linear: weight dtype ", dtype_name(weight.dtype())));
  }
  if (bias && bias->defined()) {
    std::vector<float> b(static_cast<size_t>(N));
    convert_to_f32(bias->data(), bias->dtype(), b.data(), size_t(N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) op[m * N + n] += b[size_t(n)];
  }
}

}  // namespace revolta::ops::cpu
