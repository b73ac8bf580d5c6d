// Bidirectional attention over packed sequences (the vision tower's frames) on tensor cores: WMMA
// 16x16x16 with fp16 inputs and fp32 accumulation, the V100's HMMA. q, k and v are first rounded to
// fp16 in a [head][row][padded head_dim] layout (zero columns up to 64, 80 or 128), so a tile of keys
// is one contiguous run. A block of 4 warps takes 64 query rows of one sequence and one head, a warp
// its own 16, and walks the sequence's keys in tiles of 32: S = Q K^T through shared memory, an online
// softmax in fp32 with two lanes to a row, O += P V. O stays in accumulator fragments; the row of
// each fragment element (WMMA leaves it unspecified) is read once from a fragment loaded with row
// indices, so the softmax's per-row rescale happens in registers.
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

using namespace nvcuda;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kRows = 64, kKeys = 32, kWarps = 4;

template <int DP>
struct Layout {
  static constexpr int ldq = DP + 8, lds = kKeys + 4, ldp = kKeys + 8, ldo = DP + 4;
  // per-row softmax state first: the output staging at `o` reuses everything after it
  static constexpr size_t corr = 0, l = corr + kRows * 4, q = l + kRows * 4, k = q + size_t(kRows) * ldq * 2,
                          v = k + size_t(kKeys) * ldq * 2, s = v + size_t(kKeys) * ldq * 2,
                          p = s + size_t(kRows) * lds * 4, end = p + size_t(kRows) * ldp * 2, o = q,
                          bytes = std::max(end, o + size_t(kRows) * ldo * 4);
};

// [T, H, D] float32 -> [H, T, DP] float16 with zero columns past D; blockIdx.y picks q, k or v.
__global__ void to_heads_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                int64_t T, int H, int D, int DP, __half* __restrict__ out) {
  const float* x = blockIdx.y == 0 ? q : blockIdx.y == 1 ? k : v;
  __half* o = out + int64_t(blockIdx.y) * H * T * DP;
  const int64_t n = int64_t(H) * T * DP;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % DP);
    const int64_t ht = i / DP, t = ht % T, h = ht / T;
    o[i] = __float2half_rn(d < D ? x[(t * H + h) * D + d] : 0.0f);
  }
}

// `n` of kTileRows contiguous [DP] rows into a [kTileRows][ld] tile, 16 bytes at a time; zeros past n.
template <int DP, int kTileRows>
__device__ __forceinline__ void stage(const __half* __restrict__ src, int n, int ld, __half* tile) {
  constexpr int kVec = DP / 8;
  for (int i = threadIdx.x; i < kTileRows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = (i % kVec) * 8;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (r < n) x = *reinterpret_cast<const uint4*>(src + size_t(r) * DP + c);
    *reinterpret_cast<uint4*>(tile + r * ld + c) = x;
  }
}

template <int DP>
__global__ void __launch_bounds__(kWarps * 32)
    varlen_kernel(const __half* __restrict__ qkv, const int32_t* __restrict__ starts, int tiles_per_seq, int64_t T,
                  int H, int D, float scale, float* __restrict__ out) {
  using L = Layout<DP>;
  constexpr int kCols = DP / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  float* row_corr = reinterpret_cast<float*>(smem + L::corr);
  float* row_l = reinterpret_cast<float*>(smem + L::l);
  __half* Qs = reinterpret_cast<__half*>(smem + L::q);
  __half* Ks = reinterpret_cast<__half*>(smem + L::k);
  __half* Vs = reinterpret_cast<__half*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  __half* Ps = reinterpret_cast<__half*>(smem + L::p);

  const int s = blockIdx.x / tiles_per_seq, r0 = (blockIdx.x % tiles_per_seq) * kRows, h = blockIdx.y;
  const int begin = starts[s], len = starts[s + 1] - begin;
  if (r0 >= len) return;  // the grid covers the longest sequence; shorter ones leave blocks idle
  const int rows = min(kRows, len - r0), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool busy = 16 * warp < rows;  // a warp past the last query row only helps stage
  const size_t head = size_t(h) * T * DP, plane = size_t(H) * T * DP;
  const __half* kh = qkv + plane + head + size_t(begin) * DP;
  const __half* vh = qkv + 2 * plane + head + size_t(begin) * DP;
  stage<DP, kRows>(qkv + head + size_t(begin + r0) * DP, rows, L::ldq, Qs);

  // The row of each accumulator element, from a fragment loaded with M[r][c] = r.
  float* mine = Ss + 16 * warp * L::lds;
  for (int i = lane; i < 256; i += 32) mine[(i / 16) * L::lds + i % 16] = float(i / 16);
  __syncwarp();
  Acc rows_of;
  wmma::load_matrix_sync(rows_of, mine, L::lds, wmma::mem_row_major);
  int row_of[Acc::num_elements];
#pragma unroll
  for (int e = 0; e < Acc::num_elements; ++e) row_of[e] = 16 * warp + int(rows_of.x[e]);
  Acc o[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) wmma::fill_fragment(o[c], 0.0f);

  const int i = lane / 2, half = lane % 2;  // this lane's softmax row and half of the tile's keys
  const float* srow = Ss + (16 * warp + i) * L::lds + 16 * half;
  __half* prow = Ps + (16 * warp + i) * L::ldp + 16 * half;
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 < len; k0 += kKeys) {
    __syncthreads();  // the previous tile's K/V (and the row-index scratch) are no longer read
    stage<DP, kKeys>(kh + size_t(k0) * DP, len - k0, L::ldq, Ks);
    stage<DP, kKeys>(vh + size_t(k0) * DP, len - k0, L::ldq, Vs);
    __syncthreads();
    if (!busy) continue;

    for (int j = 0; j < kKeys / 16; ++j) {  // S[this warp's 16 rows][32 keys] = Q K^T
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kCols; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, Qs + 16 * warp * L::ldq + 16 * kk, L::ldq);
        wmma::load_matrix_sync(b, Ks + 16 * j * L::ldq + 16 * kk, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ss + 16 * warp * L::lds + 16 * j, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax: 16 keys a lane, columns visited from a per-row offset to spread the banks.
    const int valid = min(16, max(0, len - k0 - 16 * half));
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int col = (c + i) & 15;
      if (col < valid) mx = fmaxf(mx, srow[col] * scale);
    }
    const float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int col = (c + i) & 15;
      const float p = col < valid ? __expf(srow[col] * scale - m_new) : 0.0f;
      sum += p;
      prow[col] = __float2half_rn(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float corr = __expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * corr + sum;
    m = m_new;
    if (half == 0) row_corr[16 * warp + i] = corr;
    __syncwarp();

#pragma unroll
    for (int c = 0; c < kCols; ++c) {  // O[16 rows][16 columns] = O * corr + P[16][32] V[32][16 columns]
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) o[c].x[e] *= row_corr[row_of[e]];
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, Ps + 16 * warp * L::ldp + 16 * kk, L::ldp);
        wmma::load_matrix_sync(b, Vs + 16 * kk * L::ldq + 16 * c, L::ldq);
        wmma::mma_sync(o[c], a, b, o[c]);
      }
    }
  }
  if (busy && half == 0) row_l[16 * warp + i] = l;
  __syncthreads();  // every tile is read: the staging below reuses Q, K, V, S and P
  float* Os = reinterpret_cast<float*>(smem + L::o);
  if (busy) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
#pragma unroll
      for (int e = 0; e < Acc::num_elements; ++e) o[c].x[e] /= row_l[row_of[e]];
      wmma::store_matrix_sync(Os + 16 * warp * L::ldo + 16 * c, o[c], L::ldo, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int x = threadIdx.x; x < rows * D; x += blockDim.x) {
    const int r = x / D, d = x % D;
    out[(size_t(begin + r0 + r) * H + h) * D + d] = Os[r * L::ldo + d];
  }
}

template <int DP>
void launch(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& starts, int longest, float scale,
            Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2);
  const int sequences = int(starts.numel() - 1);
  Tensor qkv = Tensor::uninitialized({3, H, T, DP}, DType::kF16, Device::kCUDA);
  const unsigned spread = unsigned(std::min<int64_t>((H * T * DP + 255) / 256, 4096));
  to_heads_kernel<<<dim3(spread, 3), 256, 0, stream()>>>(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), T, int(H),
                                                         int(D), DP, qkv.ptr<__half>());
  RV_CUDA_CHECK(cudaGetLastError());
  constexpr size_t bytes = Layout<DP>::bytes;
  static PerDevice configure;
  configure([] { RV_CUDA_CHECK(cudaFuncSetAttribute(varlen_kernel<DP>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes))); });
  const int tiles = (longest + kRows - 1) / kRows;
  varlen_kernel<DP><<<dim3(unsigned(sequences * tiles), unsigned(H)), kWarps * 32, bytes, stream()>>>(
      qkv.ptr<__half>(), starts.ptr<int32_t>(), tiles, T, int(H), int(D), scale, out.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts,
                      int32_t max_seq_len, float scale, Tensor& out) {
  const int64_t D = q.size(2);
  RV_CHECK(D <= 128, "CUDA varlen_attention: head_dim ", D, " (<= 128)");
  if (q.size(0) == 0 || seq_starts.numel() < 2) return;
  if (D <= 64) launch<64>(q, k, v, seq_starts, max_seq_len, scale, out);
  else if (D <= 80) launch<80>(q, k, v, seq_starts, max_seq_len, scale, out);
  else launch<128>(q, k, v, seq_starts, max_seq_len, scale, out);
}

}  // namespace revolta::cuda
