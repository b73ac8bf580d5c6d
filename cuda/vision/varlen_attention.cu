// Bidirectional attention over packed sequences (the vision tower's frames) on tensor cores: WMMA
// 16x16x16 with fp16 inputs and fp32 accumulation, the V100's HMMA. A block of 4 warps takes 64 query
// rows of one sequence and one head, a warp its own 16, and walks all of the sequence's keys in tiles
// of 32: S = Q K^T, an online softmax in fp32, O += P V with O in shared memory (WMMA fragments hide
// their row layout, so the per-row rescale happens there). head_dim is zero-padded to 64, 80 or 128
// (the towers' 72 and 80 need no more); q, k and v are float32 and are rounded as they are staged.
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>

#include "core/cuda_check.h"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

using namespace nvcuda;

constexpr int kRows = 64, kKeys = 32, kWarps = 4;

template <int DP>
struct Layout {
  static constexpr int ldq = DP + 8, lds = kKeys + 4, ldp = kKeys + 8, ldo = DP + 4;
  static constexpr size_t q = 0, k = q + size_t(kRows) * ldq * 2, v = k + size_t(kKeys) * ldq * 2,
                          s = v + size_t(kKeys) * ldq * 2, p = s + size_t(kRows) * lds * 4,
                          o = p + size_t(kRows) * ldp * 2, m = o + size_t(kRows) * ldo * 4, l = m + kRows * 4,
                          bytes = l + kRows * 4;
};

// `n` rows of [*, H, D] from row `first` as fp16 into a [rows][ld] tile, zeros past n rows and D columns.
template <int DP, int kTileRows>
__device__ __forceinline__ void stage(const float* __restrict__ src, int first, int n, int H, int h, int D, int ld,
                                      __half* tile) {
  for (int i = threadIdx.x; i < kTileRows * DP; i += blockDim.x) {
    const int r = i / DP, d = i % DP;
    tile[r * ld + d] = __float2half_rn(r < n && d < D ? src[(size_t(first + r) * H + h) * D + d] : 0.0f);
  }
}

template <int DP>
__global__ void __launch_bounds__(kWarps * 32)
    varlen_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  const int32_t* __restrict__ starts, int tiles_per_seq, int H, int D, float scale,
                  float* __restrict__ out) {
  using L = Layout<DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Qs = reinterpret_cast<__half*>(smem + L::q);
  __half* Ks = reinterpret_cast<__half*>(smem + L::k);
  __half* Vs = reinterpret_cast<__half*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  __half* Ps = reinterpret_cast<__half*>(smem + L::p);
  float* Os = reinterpret_cast<float*>(smem + L::o);
  float* row_m = reinterpret_cast<float*>(smem + L::m);
  float* row_l = reinterpret_cast<float*>(smem + L::l);

  const int s = blockIdx.x / tiles_per_seq, r0 = (blockIdx.x % tiles_per_seq) * kRows, h = blockIdx.y;
  const int begin = starts[s], len = starts[s + 1] - begin;
  if (r0 >= len) return;  // the grid covers the longest sequence; shorter ones leave blocks idle
  const int rows = min(kRows, len - r0), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool busy = 16 * warp < rows;  // a warp past the last query row only helps stage

  stage<DP, kRows>(q, begin + r0, rows, H, h, D, L::ldq, Qs);
  for (int i = threadIdx.x; i < kRows * DP; i += blockDim.x) Os[(i / DP) * L::ldo + i % DP] = 0.0f;
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) row_m[r] = -INFINITY, row_l[r] = 0.0f;

  for (int k0 = 0; k0 < len; k0 += kKeys) {
    __syncthreads();  // the previous tile's K/V are no longer read
    stage<DP, kKeys>(k, begin + k0, len - k0, H, h, D, L::ldq, Ks);
    stage<DP, kKeys>(v, begin + k0, len - k0, H, h, D, L::ldq, Vs);
    __syncthreads();
    if (!busy) continue;

    for (int j = 0; j < kKeys / 16; ++j) {  // S[this warp's 16 rows][32 keys] = Q K^T
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < DP / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, Qs + 16 * warp * L::ldq + 16 * kk, L::ldq);
        wmma::load_matrix_sync(b, Ks + 16 * j * L::ldq + 16 * kk, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ss + 16 * warp * L::lds + 16 * j, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    for (int r = 0; r < 16; ++r) {  // online softmax, one row at a time, one key per lane
      const int i = 16 * warp + r;
      const bool valid = k0 + lane < len;
      const float x = valid ? Ss[i * L::lds + lane] * scale : -INFINITY;
      const float m_old = row_m[i], m_new = fmaxf(m_old, warp_max(x));
      const float p = valid ? __expf(x - m_new) : 0.0f;
      const float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
      const float sum = warp_sum(p);
      Ps[i * L::ldp + lane] = __float2half_rn(p);
      for (int d = lane; d < DP; d += 32) Os[i * L::ldo + d] *= corr;
      __syncwarp();
      if (lane == 0) row_m[i] = m_new, row_l[i] = row_l[i] * corr + sum;
    }
    __syncwarp();

    for (int c = 0; c < DP / 16; ++c) {  // O[16 rows][16 columns] += P[16][32] V[32][16 columns]
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, Os + 16 * warp * L::ldo + 16 * c, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, Ps + 16 * warp * L::ldp + 16 * kk, L::ldp);
        wmma::load_matrix_sync(b, Vs + 16 * kk * L::ldq + 16 * c, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Os + 16 * warp * L::ldo + 16 * c, acc, L::ldo, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    out[(size_t(begin + r0 + r) * H + h) * D + d] = Os[r * L::ldo + d] / row_l[r];
  }
}

template <int DP>
void launch(const float* q, const float* k, const float* v, const int32_t* starts, int sequences, int longest, int H,
            int D, float scale, float* out) {
  constexpr size_t bytes = Layout<DP>::bytes;
  static PerDevice configure;
  configure([] { RV_CUDA_CHECK(cudaFuncSetAttribute(varlen_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))); });
  const int tiles = (longest + kRows - 1) / kRows;
  varlen_kernel<DP><<<dim3(unsigned(sequences * tiles), unsigned(H)), kWarps * 32, bytes, stream()>>>(
      q, k, v, starts, tiles, H, D, scale, out);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts,
                      int32_t max_seq_len, float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int sequences = int(seq_starts.numel() - 1);
  RV_CHECK(D <= 128, "CUDA varlen_attention: head_dim ", D, " (<= 128)");
  if (T == 0 || sequences == 0) return;
  const float* qp = q.ptr<float>();
  const float* kp = k.ptr<float>();
  const float* vp = v.ptr<float>();
  const int32_t* sp = seq_starts.ptr<int32_t>();
  if (D <= 64) launch<64>(qp, kp, vp, sp, sequences, max_seq_len, int(H), int(D), scale, out.ptr<float>());
  else if (D <= 80) launch<80>(qp, kp, vp, sp, sequences, max_seq_len, int(H), int(D), scale, out.ptr<float>());
  else launch<128>(qp, kp, vp, sp, sequences, max_seq_len, int(H), int(D), scale, out.ptr<float>());
}

}  // namespace revolta::cuda
