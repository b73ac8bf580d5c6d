// Dense linear layer on the CPU: out[M, N] = x[M, K] . W[N, K]^T with f32/f16/bf16 weights (or
// quantized blocks, dequantized per task) and f32 accumulation. Work is split over blocks of output features so that each thread streams
// its own slice of W once; for batched inputs a block of W is first widened to f32 in a
// thread-local buffer so the conversion is paid once per weight, not once per input row.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/simd.h"
#include "quant/gguf_blocks.h"

namespace revolta::ops::cpu {
namespace {

constexpr int64_t kRowsPerTask = 16;
constexpr int64_t kMaxTileRows = 4;

// MR input rows x NR weight rows of dot products over K.
template <int MR, int NR, typename W>
void dot_tile(const float* __restrict x, int64_t ldx, const typename W::T* __restrict w, int64_t ldw, int64_t K,
              float* out, int64_t ldo) {
  int64_t k = 0;
  float res[MR][NR] = {};
#if RV_AVX2
  vacc acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    // Streaming weights: fetch the next tile's rows while this one computes, so that memory
    // latency overlaps the arithmetic (the hardware prefetcher alone falls behind).
    // (A single row of f32 weights is pure streaming, which the hardware prefetcher handles
    // best; measured, not guessed.)
    if ((MR > 1 || sizeof(typename W::T) < 4) && (k * int64_t(sizeof(typename W::T))) % 64 == 0)
      for (int n = 0; n < NR; ++n)
        _mm_prefetch(reinterpret_cast<const char*>(w + (n + NR) * ldw + k), _MM_HINT_T0);
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

#if RV_AVX2
// The 4 x 2 tile of decode-sized batches, with named accumulators (GCC keeps an accumulator
// array in memory in this loop).
template <typename W>
void dot_tile_4x2(const float* __restrict x, int64_t ldx, const typename W::T* __restrict w, int64_t ldw,
                  int64_t K, float* out, int64_t ldo) {
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
  __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
  const typename W::T *w0p = w, *w1p = w + ldw;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if ((k * int64_t(sizeof(typename W::T))) % 64 == 0) {  // the next tile's rows, one line at a time
      _mm_prefetch(reinterpret_cast<const char*>(w0p + 2 * ldw + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w1p + 2 * ldw + k), _MM_HINT_T0);
    }
    __m256 w0 = load8(W{}, w0p + k), w1 = load8(W{}, w1p + k);
    // Keep the weights in registers: folded into each FMA they would be loaded four times.
    asm("" : "+x"(w0), "+x"(w1));
    __m256 v = _mm256_loadu_ps(x0 + k);
    a00 = _mm256_fmadd_ps(v, w0, a00);
    a01 = _mm256_fmadd_ps(v, w1, a01);
    v = _mm256_loadu_ps(x1 + k);
    a10 = _mm256_fmadd_ps(v, w0, a10);
    a11 = _mm256_fmadd_ps(v, w1, a11);
    v = _mm256_loadu_ps(x2 + k);
    a20 = _mm256_fmadd_ps(v, w0, a20);
    a21 = _mm256_fmadd_ps(v, w1, a21);
    v = _mm256_loadu_ps(x3 + k);
    a30 = _mm256_fmadd_ps(v, w0, a30);
    a31 = _mm256_fmadd_ps(v, w1, a31);
  }
  float r[4][2] = {{hsum(a00), hsum(a01)}, {hsum(a10), hsum(a11)}, {hsum(a20), hsum(a21)}, {hsum(a30), hsum(a31)}};
  for (; k < K; ++k) {
    const float wa = W::scalar(w0p + k), wb = W::scalar(w1p + k);
    for (int m = 0; m < 4; ++m) {
      r[m][0] += x[m * ldx + k] * wa;
      r[m][1] += x[m * ldx + k] * wb;
    }
  }
  for (int m = 0; m < 4; ++m) out[m * ldo] = r[m][0], out[m * ldo + 1] = r[m][1];
}
#endif

template <typename W>
void dot_tile_any(int mr, int nr, const float* x, int64_t ldx, const typename W::T* w, int64_t ldw,
                  int64_t K, float* out, int64_t ldo) {
#if RV_AVX2
  if (mr == 4 && nr == 2) return dot_tile_4x2<W>(x, ldx, w, ldw, K, out, ldo);
#endif
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
  // One or two input rows: 4 weight rows share each loaded input vector.
  // More: 4 input rows x 2 weight rows per tile.
  // Weight rows are the outer loop: each is read from memory once and reused from L1 for every
  // group of input rows.
  const int nr_max = M <= 2 ? 4 : 2;
  for (int64_t n = n0; n < n1; n += nr_max) {
    int nr = int(std::min<int64_t>(nr_max, n1 - n));
    for (int64_t m = 0; m < M; m += kMaxTileRows) {
      int mr = int(std::min<int64_t>(kMaxTileRows, M - m));
      dot_tile_any<W>(mr, nr, x + m * K, K, w + n * K, K, K, out + m * N + n, N);
    }
  }
}

// ---- batched path: packed weight panels, broadcast microkernel ------------------------------
// A block of 16 weight rows is widened to f32 and transposed into a [K][16] panel once; then
// every group of 6 input rows runs an outer-product kernel over it (12 accumulators, 2 weight
// vectors and 1 broadcast: 15 of the 16 AVX2 registers).
constexpr int64_t kPanel = 16;
constexpr int64_t kPanelRows = 6;

template <typename W>
void pack_panel(const typename W::T* w, int64_t rows, int64_t K, float* panel) {
  thread_local std::vector<float> row;
  row.resize(size_t(K));
  for (int64_t n = 0; n < kPanel; ++n) {
    if (n < rows) {
      const typename W::T* src = w + n * K;
      int64_t k = 0;
#if RV_AVX2
      for (; k + 8 <= K; k += 8) _mm256_storeu_ps(row.data() + k, load8(W{}, src + k));
#endif
      for (; k < K; ++k) row[size_t(k)] = W::scalar(src + k);
    } else {
      std::fill(row.begin(), row.end(), 0.0f);
    }
    for (int64_t k = 0; k < K; ++k) panel[k * kPanel + n] = row[size_t(k)];
  }
}

// out[0:6, 0:cols] = x[6, K] . panel; the twelve accumulators are named variables because GCC
// keeps an accumulator array in memory inside this loop.
void panel_kernel6(const float* __restrict x, int64_t K, const float* __restrict panel,
                   float* __restrict out, int64_t ldo, int64_t rows, int64_t cols) {
  alignas(32) float tile[kPanelRows][kPanel];
#if RV_AVX2
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
  __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  const float *x0 = x, *x1 = x + K, *x2 = x + 2 * K, *x3 = x + 3 * K, *x4 = x + 4 * K, *x5 = x + 5 * K;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(panel + k * kPanel);
    const __m256 w1 = _mm256_loadu_ps(panel + k * kPanel + 8);
    __m256 b = _mm256_broadcast_ss(x0 + k);
    a00 = _mm256_fmadd_ps(b, w0, a00);
    a01 = _mm256_fmadd_ps(b, w1, a01);
    b = _mm256_broadcast_ss(x1 + k);
    a10 = _mm256_fmadd_ps(b, w0, a10);
    a11 = _mm256_fmadd_ps(b, w1, a11);
    b = _mm256_broadcast_ss(x2 + k);
    a20 = _mm256_fmadd_ps(b, w0, a20);
    a21 = _mm256_fmadd_ps(b, w1, a21);
    b = _mm256_broadcast_ss(x3 + k);
    a30 = _mm256_fmadd_ps(b, w0, a30);
    a31 = _mm256_fmadd_ps(b, w1, a31);
    b = _mm256_broadcast_ss(x4 + k);
    a40 = _mm256_fmadd_ps(b, w0, a40);
    a41 = _mm256_fmadd_ps(b, w1, a41);
    b = _mm256_broadcast_ss(x5 + k);
    a50 = _mm256_fmadd_ps(b, w0, a50);
    a51 = _mm256_fmadd_ps(b, w1, a51);
  }
  _mm256_store_ps(tile[0], a00), _mm256_store_ps(tile[0] + 8, a01);
  _mm256_store_ps(tile[1], a10), _mm256_store_ps(tile[1] + 8, a11);
  _mm256_store_ps(tile[2], a20), _mm256_store_ps(tile[2] + 8, a21);
  _mm256_store_ps(tile[3], a30), _mm256_store_ps(tile[3] + 8, a31);
  _mm256_store_ps(tile[4], a40), _mm256_store_ps(tile[4] + 8, a41);
  _mm256_store_ps(tile[5], a50), _mm256_store_ps(tile[5] + 8, a51);
#else
  for (int64_t i = 0; i < kPanelRows; ++i)
    for (int64_t n = 0; n < kPanel; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[i * K + k] * panel[k * kPanel + n];
      tile[i][n] = s;
    }
#endif
  for (int64_t i = 0; i < rows; ++i) std::copy_n(tile[i], cols, out + i * ldo);
}

// Weight rows [n0, n0 + cols) (cols <= kPanel) against all M input rows.
template <typename W>
void linear_panel(const float* x, int64_t M, int64_t K, const typename W::T* rows, int64_t cols, float* out, int64_t N) {
  thread_local std::vector<float> panel;
  panel.resize(size_t(K * kPanel));
  pack_panel<W>(rows, cols, K, panel.data());
  int64_t m = 0;
  for (; m + kPanelRows <= M; m += kPanelRows) panel_kernel6(x + m * K, K, panel.data(), out + m * N, N, kPanelRows, cols);
  if (m < M) {  // the last rows, zero-padded to a full group
    thread_local std::vector<float> padded;
    padded.assign(size_t(kPanelRows * K), 0.0f);
    std::copy_n(x + m * K, (M - m) * K, padded.begin());
    panel_kernel6(padded.data(), K, panel.data(), out + m * N, N, M - m, cols);
  }
}

template <typename W>
void linear_batched(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t N, float* out) {
  const int64_t tasks = (N + kPanel - 1) / kPanel;
  parallel_tasks(tasks, [&](int64_t t) {
    const int64_t n0 = t * kPanel;
    linear_panel<W>(x, M, K, w + n0 * K, std::min(kPanel, N - n0), out + n0, N);
  });
}

// ---- small-M path: weights streamed once, dot products -------------------------------------
template <typename W>
void linear_small(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t N, float* out) {
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  auto run = [&](int64_t t) {
    const int64_t n0 = t * kRowsPerTask, n1 = std::min(N, n0 + kRowsPerTask);
    linear_block<W>(x, M, K, w, n0, n1, out, N);
  };
  parallel_tasks(tasks, run);
}

template <typename W>
void linear_typed(const float* x, int64_t M, int64_t K, const typename W::T* w, int64_t N, float* out) {
  // Decode-sized batches are bound by reading the weights once; larger ones by arithmetic.
  if (M >= 32) linear_batched<W>(x, M, K, w, N, out);
  else linear_small<W>(x, M, K, w, N, out);
}

// Quantized blocks (quant/gguf_blocks.h): decode-sized inputs take integer dot products where the
// format has them; otherwise each task dequantizes its weight rows into float32 and runs the
// float32 kernels over them, so the weights are read once, as stored.
constexpr int64_t kIntegerDotRows = 32;
void linear_blocks(const float* x, int64_t M, int64_t K, const Tensor& w, int64_t N, float* out) {
  if (M < kIntegerDotRows && linear_blocks_int8(x, M, K, w, N, out)) return;
  const int64_t per_task = M >= 32 ? kPanel : kRowsPerTask, row_bytes = dtype_bytes(w.dtype(), K);
  const char* base = static_cast<const char*>(w.data());
  parallel_tasks((N + per_task - 1) / per_task, [&](int64_t t) {
    const int64_t n0 = t * per_task, cols = std::min(per_task, N - n0);
    thread_local std::vector<float> rows;
    rows.resize(size_t(cols * K));
    for (int64_t n = 0; n < cols; ++n) dequantize(w.dtype(), base + (n0 + n) * row_bytes, rows.data() + n * K, K);
    if (M >= 32) linear_panel<F32W>(x, M, K, rows.data(), cols, out + n0, N);
    else linear_block<F32W>(x, M, K, rows.data(), 0, cols, out + n0, N);
  });
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
    default:
      if (!is_block_dtype(weight.dtype()))
        throw std::invalid_argument(str_cat("linear: weight dtype ", dtype_name(weight.dtype())));
      linear_blocks(xp, M, K, weight, N, op);
  }
  if (bias && bias->defined()) {
    std::vector<float> b(static_cast<size_t>(N));
    convert_to_f32(bias->data(), bias->dtype(), b.data(), size_t(N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) op[m * N + n] += b[size_t(n)];
  }
}

}  // namespace revolta::ops::cpu
