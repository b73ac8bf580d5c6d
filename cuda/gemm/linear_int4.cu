// Linear layers over 4-bit group weights (DType::kI4G32 / kI4G128, gemm/int4_words.cuh says how a
// word is read), for the SM70 instruction set: nothing past fp16 arithmetic and 32-bit integer logic.
//  - up to kGemvRows activation rows: a GEMV per warp streaming R weight rows a word per lane, eight
//    rows of x at a time (grid.y takes further chunks of eight, each reading the weights again: at
//    0.53 bytes a value, eight re-reads move less than an f16 copy written and read);
//  - more rows: the weights dequantized to f16 once, then the f16 tensor-core GEMM.
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"
#include "gemm/int4_words.cuh"
#include "quant/int4_groups.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kGemvRows = 64;

// out[m, n] = sum_k x[m, k] w[n, k] for M rows of x (grid.y: chunks of M rows) and R weight rows per
// warp. A lane takes one word (8 values) of each row per step, so a warp's step covers 256
// consecutive values: its x loads are coalesced and shared by the R rows, and the lanes of a group
// read its header in one load. The words of U steps load before any is used, and the next U steps'
// while those are computed (the first before the predecessor's wait: weights do not depend on it).
// (A lane taking 32 values, one 16-byte load, measured slower: 72 against 50 us for 28672 x 4096
// at one row on the H200, its x loads no longer coalesced.)
template <int G, int M, int R, int U>
__global__ void __launch_bounds__(32 * kWarps)
    int4_gemv_kernel(const float* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ bias,
                     float* __restrict__ out, int N, int K) {
  x += size_t(blockIdx.y) * M * K;
  out += size_t(blockIdx.y) * M * N;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * R;
  if (n0 >= N) {
    wait_for_predecessor();
    return;
  }
  constexpr int kStep = 32 * 8;
  using B = Int4Block<G>;
  const size_t row_bytes = size_t(K / B::kValues) * B::kBytes;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + size_t(min(n0 + r, N - 1)) * row_bytes;  // (rows past N: unused)
  uint32_t head[U][R], word[U][R];
  auto load = [&](int k) { int4_load_steps<G, R, U>(rows, k, K, head, word); };
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  int k = lane * 8;
  load(k);
  wait_for_predecessor();
  for (; k < K; k += U * kStep) {
    uint32_t h[U][R], q[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) h[u][r] = head[u][r], q[u][r] = word[u][r];
    if (k + U * kStep < K) load(k + U * kStep);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * kStep;
      if (kk >= K) break;
      float xv[M][8];
#pragma unroll
      for (int m = 0; m < M; ++m) load8_input(x + size_t(m) * K + kk, xv[m]);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] += int4_word_dot(q[u][r], h[u][r], xv[m]);
    }
  }
  let_successor_launch();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == 0 && n0 + r < N) out[size_t(m) * N + n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
    }
}

// Thread per word: eight values to f16.
__global__ void int4_dequantize_kernel(const uint8_t* __restrict__ w, __half* __restrict__ out, int64_t words, int K,
                                       int group, int block_bytes) {
  enter_dependent();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const int64_t row = i / (K / 8), col = (i % (K / 8)) * 8;
  const Int4Row r{w + row * (K / (4 * group)) * block_bytes, group, block_bytes};
  *reinterpret_cast<uint4*>(out + row * K + col) = int4_word_halves(r.word(int(col)), r.head(int(col)));
}

template <int G, int M, int R, int U>
void gemv(const float* x, const uint8_t* w, const float* bias, float* out, int chunks, int N, int K) {
  const unsigned blocks = unsigned((N + kWarps * R - 1) / (kWarps * R));
  launch_dependent(int4_gemv_kernel<G, M, R, U>, dim3(blocks, unsigned(chunks)), dim3(32 * kWarps), 0, x, w, bias, out,
                   N, K);
}

// M rows of x (any M <= 8) in one launch.
template <int G>
void gemv_rows(const float* x, const uint8_t* w, const float* bias, float* out, int M, int chunks, int N, int K) {
  switch (M) {
    case 1: gemv<G, 1, 2, 4>(x, w, bias, out, chunks, N, K); break;
    case 2: gemv<G, 2, 2, 2>(x, w, bias, out, chunks, N, K); break;
    case 3: gemv<G, 3, 2, 2>(x, w, bias, out, chunks, N, K); break;
    case 4: gemv<G, 4, 2, 2>(x, w, bias, out, chunks, N, K); break;
    case 5: gemv<G, 5, 2, 2>(x, w, bias, out, chunks, N, K); break;
    case 6: gemv<G, 6, 2, 2>(x, w, bias, out, chunks, N, K); break;
    case 7: gemv<G, 7, 2, 2>(x, w, bias, out, chunks, N, K); break;
    default: gemv<G, 8, 2, 2>(x, w, bias, out, chunks, N, K); break;
  }
}

void gemv_rows(const float* x, const uint8_t* w, const float* bias, float* out, int M, int chunks, int N, int K,
               int group) {
  if (group == 32) gemv_rows<32>(x, w, bias, out, M, chunks, N, K);
  else gemv_rows<128>(x, w, bias, out, M, chunks, N, K);
}

}  // namespace

void dequantize_int4(const Tensor& weight, Tensor& out) {
  const int64_t N = weight.size(0), K = weight.size(1), group = int4_group_size(weight.dtype());
  RV_CHECK(out.dtype() == DType::kF16 && out.numel() == N * K, "dequantize_int4: out f16 [", N, ", ", K, "] expected");
  const int64_t words = N * K / 8;
  launch_dependent(int4_dequantize_kernel, dim3(unsigned((words + 255) / 256)), dim3(256), 0,
                   static_cast<const uint8_t*>(weight.data()), out.ptr<__half>(), words, int(K), int(group),
                   int(dtype_bytes(weight.dtype(), 4 * group)));
  RV_CUDA_CHECK(cudaGetLastError());
}

void linear_int4(const Tensor& x, const Tensor& weight, const Tensor* bias_tensor, Tensor& out) {
  const int64_t K = weight.size(1), N = weight.size(0), M = x.numel() / K;
  const int group = int(int4_group_size(weight.dtype()));
  const auto* w = static_cast<const uint8_t*>(weight.data());
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  if (M > kGemvRows) {
    Tensor dense = Tensor::uninitialized({N, K}, DType::kF16, Device::kCUDA);
    dequantize_int4(weight, dense);
    linear(x, dense, bias_tensor, out);
    return;
  }
  const float* bias = bias_tensor && bias_tensor->defined() ? bias_tensor->ptr<float>() : nullptr;
  const int full = int(M / 8), rest = int(M % 8);
  if (full) gemv_rows(xp, w, bias, op, 8, full, int(N), int(K), group);
  if (rest) gemv_rows(xp + size_t(full) * 8 * K, w, bias, op + size_t(full) * 8 * N, rest, 1, int(N), int(K), group);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
