// Dense linear layer out[M, N] = x[M, K] . W[N, K]^T (+ bias) with f32 or f16 weights and f32
// accumulation, for the SM70 instruction set.
//  - decode-sized M (<= 8): a GEMV per warp, each warp streaming one weight row with 16-byte loads
//    and keeping M accumulators per lane: bound by the weight bytes, as decode is;
//  - one token with f16 rows of 4096 columns and a grid resident at once (Qwen3-Next's output
//    projections), or of 2048 columns and up to four waves (its attention QKV, Llama-1B): each
//    warp's whole rows from before the predecessor's end, x staged in shared memory (gemv_row_kernel);
//    its scaled form takes a norm of x's column groups left to it (linear_scaled: gdn_decode's);
//  - decode batches of 6..64 rows with f16 weights: split-K tensor-core fragments (gemm_skinny.cuh);
//  - larger M with f16 weights: tensor-core tiles (gemm_tensor_core.cuh);
//  - larger M with f32 weights: a shared-memory tiled SIMT GEMM (64 x 64 tiles).
#include <cuda_fp16.h>

#include <algorithm>

#include "gemm/gemm_skinny.cuh"
#include "gemm/gemm_tensor_core.cuh"

#include "core/activations.cuh"
#include "core/cuda_check.h"
#include "core/element.cuh"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
RV_PROBE_TU();
namespace {

constexpr int kWarpsPerBlock = 4;

// ops::GroupScale as the kernels take it: row t's group g is scaled by the inverse RMS of the sum
// of squares[(t * groups + g) * parts, + parts), over `group` values.
struct Scales {
  const float* squares = nullptr;
  int group = 0, parts = 0;
  float eps = 0.0f;
};
constexpr int kMaxSquares = 32 * kWarpsPerBlock;  // the scaled whole-row form: a thread per partial square

// R weight rows per warp share each activation load (the activations of M rows would otherwise
// be re-read per weight row: at M = 8 that traffic exceeds the weights'); U steps of 8 elements per
// lane are loaded before any is used, so U x R 16-byte loads per lane are in flight. One row
// group per warp (a persistent grid striding over them measured slower at M = 1).
template <typename W, int M, int R, int U, bool kChunks = false>  // kChunks: grid.y takes chunks of M rows
__global__ void gemv_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ out, int N, int K) {
  if (kChunks) {  // f32 weights past 8 rows (gemv_chunks); the other forms keep their code as it was
    x += size_t(blockIdx.y) * M * K;
    out += size_t(blockIdx.y) * M * N;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarpsPerBlock + warp) * R;
  if (n0 >= N) {
    wait_for_predecessor();
    return;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const bool vec = (K % 8 == 0) && (reinterpret_cast<uintptr_t>(w) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(x) % 16 == 0);
  constexpr int kStep = 32 * 8;
  int k = lane * 8;
  float wv[R][U][8];
  auto load_weights = [&] {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (n0 + r < N) load_weight8(w + size_t(n0 + r) * K + k + u * kStep, wv[r][u]);
        else
#pragma unroll
          for (int i = 0; i < 8; ++i) wv[r][u][i] = 0.0f;
      }
  };
  // At M = 1 the first weights load while the previous kernel drains (they do not depend on it).
  // Larger M keep the plain loop: the peeled form measured slower there (concurrency 8).
  constexpr bool kEarly = M == 1;
  if (kEarly && vec && k + (U - 1) * kStep < K) load_weights();
  wait_for_predecessor();
  if (vec) {
    for (; k + (U - 1) * kStep < K; k += U * kStep) {
      if (!kEarly || k != lane * 8) load_weights();
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          float xv[8];
          load8_input(x + size_t(m) * K + k + u * kStep, xv);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][m] += wv[r][u][i] * xv[i];
        }
    }
    for (; k < K; k += kStep) {  // the last steps, one at a time
      float xv[8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (n0 + r >= N) break;
        float wv[8];
        load_weight8(w + size_t(n0 + r) * K + k, wv);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          load8_input(x + size_t(m) * K + k, xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][m] += wv[i] * xv[i];
        }
      }
    }
    k = K;  // every element was covered by some lane
  } else {
    k = 0;
  }
  for (int kk = k + lane; kk < K; kk += 32) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (n0 + r >= N) break;
      const float wv = to_float(w[size_t(n0 + r) * K + kk]);
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] += wv * x[size_t(m) * K + kk];
    }
  }
  let_successor_launch();  // the weights are read: the next kernel may take the SMs as warps finish
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
      v = warp_sum(v);
      if (lane == 0 && n0 + r < N) out[size_t(m) * N + n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
    }
}

// One row per warp of a single-token GEMV with f16 weights and K = 256 * kSteps (an output
// projection: K = 4096 at Qwen3-Next's shape): the whole row is loaded before the wait, as raw
// halves (the registers that half a row of floats took), and after it the block stages x in
// shared memory with one round trip and every warp dots its row from there. Inside a decode
// step the blocks start while the predecessor's tail runs (a chain of round trips that leaves
// the memory idle), so after the wait no weight bytes are left to stream. (H200, Qwen3-Next shape,
// concurrency 1: 497.1 / 498.5 against 492.0 / 491.2 tok/s with half a row of floats before the
// wait; in the start probe the blocks' last x staging ends ~1 us after the wait, against 3.4-5.2 us
// for the loop over the second half-row.) R rows per warp share each x read from shared memory,
// and fewer blocks stage x (each block reads all of it from L2 at the same moment): two rows for
// K = 4096 (170 registers, 256 blocks at Qwen3-Next's shape: 509.2 against 501.9 tok/s with one)
// and for K = 2048 (92 registers; Qwen3-Next's attention QKV and Llama-1B's projections: 500.8
// against 498.8 tok/s, and Llama-1B 1,127 against 1,063, against the half-row form in one run).
// kScaled (linear_scaled): a thread per partial square loads it with x into shared memory; after the
// barrier lane g of each warp sums group g's parts into its inverse RMS, and each step's dots are
// scaled by their group's, taken by a shuffle (a lane's 8 columns lie in one group). (A second
// barrier and a pass scaling x in shared memory lost 1.3% at concurrency 1 (H200); a
// loop over a group's parts over global loads took 241 registers against 170.)
template <int kSteps, int R, bool kScaled = false>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    gemv_row_kernel(const float* __restrict__ x, const __half* __restrict__ w, const float* __restrict__ bias,
                    float* __restrict__ out, int N, Scales sc) {
  constexpr int K = 256 * kSteps, kPerThread = K / 4 / (32 * kWarpsPerBlock);
  static_assert(K % (4 * 32 * kWarpsPerBlock) == 0, "x staged in whole float4 rounds");
  __shared__ float4 xs[K / 4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n0 = (blockIdx.x * kWarpsPerBlock + warp) * R;
  RV_PROBE_BLOCK(ProbeKind::kGemvRow);
  uint4 wr[R][kSteps];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const __half* row = w + size_t(min(n0 + r, N - 1)) * K + lane * 8;  // (rows past N load the last row, unused)
#pragma unroll
    for (int u = 0; u < kSteps; ++u) wr[r][u] = load_weight_raw8(row + u * 256);
  }
  wait_for_predecessor();
  RV_PROBE_MARK(1);
  float4 xv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) xv[i] = load_input4(x + 4 * (i * 32 * kWarpsPerBlock + threadIdx.x));
  __shared__ float sq[kScaled ? kMaxSquares : 1];
  const bool loads_square = kScaled && int(threadIdx.x) < K / sc.group * sc.parts;
  const float square = loads_square ? load_input(sc.squares + threadIdx.x) : 0.0f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) xs[i * 32 * kWarpsPerBlock + threadIdx.x] = xv[i];
  if (loads_square) sq[threadIdx.x] = square;
  __syncthreads();
  RV_PROBE_MARK(2);
  let_successor_launch();
  float inv = 1.0f;  // kScaled: lane g's is group g's inverse RMS (groups <= 32)
  if (kScaled && lane < K / sc.group) {
    float sum = 0.0f;
    for (int p = 0; p < sc.parts; ++p) sum += sq[lane * sc.parts + p];
    inv = rsqrtf(sum / float(sc.group) + sc.eps);
  }
  float acc[R] = {};
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    float v[8];
    split8(xs[(u * 256 + lane * 8) / 4], xs[(u * 256 + lane * 8) / 4 + 1], v);
    if constexpr (kScaled) {  // a lane's 8 columns lie in one group (group % 8 == 0)
      const float g = __shfl_sync(0xffffffffu, inv, (u * 256 + lane * 8) / sc.group);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += g * dot8(wr[r][u], v);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += dot8(wr[r][u], v);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && n0 + r < N) out[n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
  }
}

// The MLP's first half for decode: a warp takes P consecutive outputs i and reads both their
// gate row i and up row I + i, so the activation silu(g) * u is written directly (no gate_up
// tensor, no separate silu_mul launch).
template <typename W, int M, int P>
__global__ void swiglu_gemv_kernel(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ act, int I,
                                   int K) {
  wait_for_predecessor();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = (blockIdx.x * kWarpsPerBlock + warp) * P;
  if (i0 >= I) return;
  float g[P][M], u[P][M];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int m = 0; m < M; ++m) g[p][m] = u[p][m] = 0.0f;
  for (int k = lane * 8; k < K; k += 32 * 8) {  // K % 8 == 0 (checked by the caller)
    float wg[P][8], wu[P][8];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int i = min(i0 + p, I - 1);  // a ragged last pair recomputes row I - 1; not written
      load_weight8(w + size_t(i) * K + k, wg[p]);
      load_weight8(w + size_t(I + i) * K + k, wu[p]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xv[8];
      load8_input(x + size_t(m) * K + k, xv);
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int e = 0; e < 8; ++e) g[p][m] += wg[p][e] * xv[e], u[p][m] += wu[p][e] * xv[e];
    }
  }
  let_successor_launch();
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float gv = g[p][m], uv = u[p][m];
      for (int o = 16; o > 0; o >>= 1) {
        gv += __shfl_xor_sync(0xffffffffu, gv, o);
        uv += __shfl_xor_sync(0xffffffffu, uv, o);
      }
      if (lane == 0 && i0 + p < I) act[size_t(m) * I + i0 + p] = silu(gv) * uv;
    }
}

constexpr int kTile = 64, kTileK = 16;

template <typename W>
__global__ void gemm_kernel(const float* __restrict__ x, const W* __restrict__ w, const float* __restrict__ bias,
                            float* __restrict__ out, int M, int N, int K) {
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 256 threads: 16 x 16, 4 x 4 outputs each
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += 256) {
      const int r = i / kTileK, c = i % kTileK;
      xs[c][r] = (m0 + r < M && k0 + c < K) ? x[size_t(m0 + r) * K + k0 + c] : 0.0f;
      ws[c][r] = (n0 + r < N && k0 + c < K) ? to_float(w[size_t(n0 + r) * K + k0 + c]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kTileK; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[c][ty * 4 + i], b[i] = ws[c][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m < M && n < N) out[size_t(m) * N + n] = acc[i][j] + (bias ? bias[n] : 0.0f);
    }
}

// The whole-row form for one token of f16 weights, where it applies. K = 4096: only for grids that
// are resident at once, since its gain is every block's rows loaded before the wait (a later
// wave's blocks start after it). Measured on Qwen3-Next's output projections (256 blocks); wider
// ones (Llama-8B's q / k / v, 768 blocks) keep the half-row form they were measured with.
// With sc.squares, the scaled form (groups of a multiple of 8 columns, at most 32 groups and
// kMaxSquares parts in all).
bool gemv_row(const float*, const float*, const float*, float*, int, int, const Scales& = {}) { return false; }
bool gemv_row(const float* xp, const __half* w, const float* bias, float* op, int N, int K, const Scales& sc = {}) {
  if ((K != 4096 && K != 2048) || reinterpret_cast<uintptr_t>(xp) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0 ||
      (sc.squares && (sc.group % 8 != 0 || K / sc.group > 32 || K / sc.group * sc.parts > kMaxSquares)))
    return false;
  auto go = [&](auto kernel, int rows, int waves) {
    const int64_t blocks = (N + kWarpsPerBlock * rows - 1) / (kWarpsPerBlock * rows);
    const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * kWarpsPerBlock, 0);
    if (blocks > int64_t(waves) * per_sm * sm_count()) return false;
    launch_dependent(kernel, dim3(unsigned(blocks)), dim3(32 * kWarpsPerBlock), 0, xp, w, bias, op, N, sc);
    return true;
  };
  if (K == 4096) return sc.squares ? go(gemv_row_kernel<16, 2, true>, 2, 1) : go(gemv_row_kernel<16, 2>, 2, 1);
  // K = 2048 (Qwen3-Next's attention QKV, 9216 rows: 1,152 blocks): up to four waves, since what
  // it buys there is x shared by two rows and fewer blocks, not only the rows before the wait.
  return sc.squares ? go(gemv_row_kernel<8, 2, true>, 2, 4) : go(gemv_row_kernel<8, 2>, 2, 4);
}

// linear_scaled's other forms: the scaled copy of x, for the linear layer after it.
__global__ void scale_groups_kernel(const float* __restrict__ x, Scales sc, float* __restrict__ out, int K, int64_t n) {
  enter_dependent();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / K;
  const int g = int(i % K) / sc.group, groups = K / sc.group;
  const float* s = sc.squares + (t * groups + g) * sc.parts;
  float sum = 0.0f;  // (load_input: a read-only load could be hoisted above the wait)
  for (int p = 0; p < sc.parts; ++p) sum += load_input(s + p);
  out[i] = load_input(x + i) * rsqrtf(sum / float(sc.group) + sc.eps);
}

// The GEMV for M <= 8 rows.
template <typename W>
void gemv(const float* xp, const W* w, const float* bias, float* op, int M, int N, int K) {
  auto launch = [&](auto kernel, int rows_per_warp) {
    const int per_block = kWarpsPerBlock * rows_per_warp;
    launch_dependent(kernel, dim3(unsigned((N + per_block - 1) / per_block)), dim3(32 * kWarpsPerBlock), 0, xp, w, bias, op,
                     N, K);
  };
  switch (M) {
    case 1:  // four rows per warp share x loads, but only when that still leaves >= 8 blocks per SM;
             // otherwise the whole-row form where it applies, else a row per warp with 8 loads per
             // lane in flight (few warps: latency bound).
      if (N >= 8 * kWarpsPerBlock * 4 * sm_count()) launch(gemv_kernel<W, 1, 4, 1>, 4);
      else if (!gemv_row(xp, w, bias, op, N, K)) launch(gemv_kernel<W, 1, 1, 8>, 1);
      break;
    case 2: launch(gemv_kernel<W, 2, 2, 2>, 2); break;
    case 3: launch(gemv_kernel<W, 3, 2, 2>, 2); break;
    case 4: launch(gemv_kernel<W, 4, 4, 1>, 4); break;
    case 5: launch(gemv_kernel<W, 5, 4, 1>, 4); break;
    case 6: launch(gemv_kernel<W, 6, 4, 1>, 4); break;
    case 7: launch(gemv_kernel<W, 7, 4, 1>, 4); break;
    default: launch(gemv_kernel<W, 8, 4, 1>, 4); break;
  }
}

// f32 weights have no tensor-core path; up to kChunkedRows rows they take the GEMV eight rows at a
// time (the chunks side by side in one launch, each reading the weights) rather than the SIMT
// tiles, whose grid is N / 64 blocks at such M: the MoE router (N = 513) of a 16-token decode batch
// took 247 us a layer on the H200 that way, against a few us as GEMVs.
constexpr int kChunkedRows = 64;

// Runs when it applies (f32 weights, M <= kChunkedRows); else false, like skinny_gemm.
bool gemv_chunks(const float* xp, const float* w, const float* bias, float* op, int M, int N, int K) {
  if (M > kChunkedRows) return false;
  const int full = M / 8, rest = M % 8, per_block = kWarpsPerBlock * 4;
  launch_dependent(gemv_kernel<float, 8, 4, 1, true>, dim3(unsigned((N + per_block - 1) / per_block), unsigned(full)),
                   dim3(32 * kWarpsPerBlock), 0, xp, w, bias, op, N, K);
  if (rest) gemv(xp + size_t(full) * 8 * K, w, bias, op + size_t(full) * 8 * N, rest, N, K);
  return true;
}

bool gemv_chunks(const float*, const __half*, const float*, float*, int, int, int) { return false; }  // f16: skinny_gemm

template <typename W>
void run(const Tensor& x, const W* w, const float* bias, Tensor& out, int M, int N, int K) {
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  if (skinny_gemm(xp, w, bias, op, M, N, K)) {
  } else if (M <= 8) {
    gemv(xp, w, bias, op, M, N, K);
  } else if (!tensor_core_gemm(xp, w, bias, op, M, N, K) && !gemv_chunks(xp, w, bias, op, M, N, K)) {
    dim3 grid(unsigned((N + kTile - 1) / kTile), unsigned((M + kTile - 1) / kTile));
    gemm_kernel<W><<<grid, 256, 0, stream()>>>(xp, w, bias, op, M, N, K);
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  const int64_t K = weight.size(1), N = weight.size(0), M = x.numel() / K;
  RV_CHECK(out.numel() == M * N, "CUDA linear: x ", x.shape_str(), " weight ", weight.shape_str());
  if (M == 0) return;
  const float* b = bias && bias->defined() ? bias->ptr<float>() : nullptr;
  if (weight.dtype() == DType::kF32) run(x, weight.ptr<float>(), b, out, int(M), int(N), int(K));
  else if (weight.dtype() == DType::kF16) run(x, weight.ptr<__half>(), b, out, int(M), int(N), int(K));
  else if (weight.dtype() == DType::kI4G32 || weight.dtype() == DType::kI4G128) linear_int4(x, weight, bias, out);
  else throw std::invalid_argument(str_cat("CUDA linear: weights must be float32, float16 or 4-bit groups (bf16 is ",
                                           "converted at load), got ", dtype_name(weight.dtype())));
}

// One token with f16 weights where the whole-row form applies: its scaled form; else the scaled
// copy of x, then the linear layer.
void linear_scaled(const Tensor& x, const ops::GroupScale& scale, const Tensor& weight, Tensor& out) {
  const Tensor& sq = *scale.squares;
  const int64_t K = weight.size(1), N = weight.size(0), M = x.size(0), groups = sq.size(1);
  RV_CHECK(x.size(1) == K && out.numel() == M * N, "CUDA linear_scaled: x ", x.shape_str(), " weight ", weight.shape_str());
  if (M == 0) return;
  const Scales sc{sq.ptr<float>(), int(K / groups), int(sq.size(2)), scale.eps};
  if (M == 1 && weight.dtype() == DType::kF16 && gemv_row(x.ptr<float>(), weight.ptr<__half>(), nullptr, out.ptr<float>(), int(N), int(K), sc)) {
    RV_CUDA_CHECK(cudaGetLastError());
    return;
  }
  Tensor scaled = Tensor::uninitialized({M, K}, DType::kF32, Device::kCUDA);
  const int64_t n = M * K;
  launch_dependent(scale_groups_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, x.ptr<float>(), sc,
                   scaled.ptr<float>(), int(K), n);
  RV_CUDA_CHECK(cudaGetLastError());
  linear(scaled, weight, nullptr, out);
}

void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act) {
  const int64_t K = gate_up_weight.size(1), I = gate_up_weight.size(0) / 2, M = x.numel() / K;
  if (M == 0) return;
  const bool fused = M <= 8 && (M < kSkinnyMinRows || K % skinny::kTileK != 0 || I % 8 != 0) && K % 8 == 0 && gate_up_weight.dtype() == DType::kF16 &&
                     reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 && reinterpret_cast<uintptr_t>(gate_up_weight.data()) % 16 == 0;
  if (!fused) {
    Tensor gu = Tensor::uninitialized({M, 2 * I}, DType::kF32, Device::kCUDA);
    linear(x, gate_up_weight, nullptr, gu);
    silu_mul(gu, act);
    return;
  }
  const float* xp = x.ptr<float>();
  const __half* w = gate_up_weight.ptr<__half>();
  float* ap = act.ptr<float>();
  constexpr int P = 2;
  const unsigned blocks = unsigned((I + kWarpsPerBlock * P - 1) / (kWarpsPerBlock * P));
  switch (M) {
#define RV_SWIGLU_CASE(m) \
  case m: launch_dependent(swiglu_gemv_kernel<__half, m, P>, dim3(blocks), dim3(32 * kWarpsPerBlock), 0, xp, w, ap, int(I), int(K)); break;
    RV_SWIGLU_CASE(1) RV_SWIGLU_CASE(2) RV_SWIGLU_CASE(3) RV_SWIGLU_CASE(4)
    RV_SWIGLU_CASE(5) RV_SWIGLU_CASE(6) RV_SWIGLU_CASE(7) RV_SWIGLU_CASE(8)
#undef RV_SWIGLU_CASE
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
