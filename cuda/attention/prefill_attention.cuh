// Flash-style prefill attention on tensor cores (WMMA 16x16x16, fp16 inputs, fp32 accumulation:
// the V100's HMMA). One block of 4 warps takes a tile of query rows of one sequence and one head
// and walks the sequence's context (cached prefix + this chunk, causal) in tiles of 32 keys: S = Q K^T,
// an online softmax in fp32 in shared memory, O += P V on tensor cores with O kept in shared memory
// (WMMA fragments hide their row layout, so the per-row rescale happens there). head_dim 64 or 128:
// 64 rows, a warp's own 16 (~82 KB of shared memory at 128; V100: 96 KB per SM); head_dim 256: 32
// rows (89 KB), two warps to each 16, sharing its keys, softmax rows and output columns.
// Quantized caches (kv_elements.cuh) are scaled back to float16 as their tiles are staged.
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

#include "attention/kv_elements.cuh"
#include "core/cuda_check.h"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {

constexpr int kPrefillKeys = 32, kPrefillWarps = 4;

// Query rows a block takes at head_dim D: 64 would not fit in 96 KB at 256.
constexpr int prefill_rows(int D) { return D > 128 ? 32 : 64; }
inline bool prefill_supported(int D) { return D == 64 || D == 128 || D == 256; }

namespace prefill {

using namespace nvcuda;

template <int D>
struct Smem {
  static constexpr int rows = prefill_rows(D);
  static constexpr int ldq = D + 8, lds = kPrefillKeys + 4, ldp = kPrefillKeys + 8, ldo = D + 4;
  static constexpr size_t q = 0, k = q + size_t(rows) * ldq * 2, v = k + size_t(kPrefillKeys) * ldq * 2,
                          s = v + size_t(kPrefillKeys) * ldq * 2, p = s + size_t(rows) * lds * 4,
                          o = p + size_t(rows) * ldp * 2, m = o + size_t(rows) * ldo * 4,
                          l = m + rows * 4, bytes = l + rows * 4;
};

// Warps that share a 16-row group: one (its own rows) or two (a block-wide barrier between phases).
template <int kShare>
__device__ __forceinline__ void sync_group() {
  if constexpr (kShare == 1) __syncwarp();
  else __syncthreads();
}

// One 32-key tile of K and V into shared memory as float16 (unwritten keys past n_keys as zeros),
// element by element (quantized and float32 caches).
template <typename C, int D>
__device__ __forceinline__ void stage_keys_scalar(const C* __restrict__ kc, const C* __restrict__ vc, const KvScales& sc,
                                                  const int32_t* table, int block_size, int KVH, int kvh, int k0,
                                                  int n_keys, __half* Ks, __half* Vs) {
  constexpr int ld = Smem<D>::ldq;
  for (int i = threadIdx.x; i < kPrefillKeys * D; i += blockDim.x) {
    const int r = i / D, d = i % D, j = k0 + r;
    __half kv = __float2half_rn(0.0f), vv = kv;
    if (j < n_keys) {
      const size_t slot_row = (size_t(table[j / block_size]) * block_size + j % block_size) * KVH + kvh;
      const size_t at = slot_row * D + d;
      if constexpr (kQuantized<C>) {
        const float fk = kScaledRows<C> ? sc.k_rows[slot_row] : sc.k, fv = kScaledRows<C> ? sc.v_rows[slot_row] : sc.v;
        kv = __float2half_rn(to_raw(kc[at]) * fk);
        vv = __float2half_rn(to_raw(vc[at]) * fv);
      } else {
        kv = to_half(kc[at]);
        vv = to_half(vc[at]);
      }
    }
    Ks[r * ld + d] = kv;
    Vs[r * ld + d] = vv;
  }
}

// The same; float16 caches with 16-byte loads, eight values each.
template <typename C, int D>
__device__ __forceinline__ void stage_keys(const C* __restrict__ kc, const C* __restrict__ vc, const KvScales& sc,
                                           const int32_t* table, int block_size, int KVH, int kvh, int k0, int n_keys,
                                           __half* Ks, __half* Vs) {
  constexpr int ld = Smem<D>::ldq;
  if constexpr (std::is_same_v<C, __half>) {
    for (int i = threadIdx.x; i < kPrefillKeys * D / 8; i += blockDim.x) {
      const int r = i / (D / 8), d = (i % (D / 8)) * 8, j = k0 + r;
      uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
      if (j < n_keys) {
        const size_t at = ((size_t(table[j / block_size]) * block_size + j % block_size) * KVH + kvh) * D + d;
        kv = *reinterpret_cast<const uint4*>(kc + at);
        vv = *reinterpret_cast<const uint4*>(vc + at);
      }
      *reinterpret_cast<uint4*>(Ks + r * ld + d) = kv;
      *reinterpret_cast<uint4*>(Vs + r * ld + d) = vv;
    }
  } else {
    stage_keys_scalar<C, D>(kc, vc, sc, table, block_size, KVH, kvh, k0, n_keys, Ks, Vs);
  }
}

template <typename C, int D>
__global__ void __launch_bounds__(kPrefillWarps * 32) prefill_kernel(
    const float* __restrict__ q, const C* __restrict__ kc, const C* __restrict__ vc, KvScales sc,
    const int32_t* __restrict__ query_start, const int32_t* __restrict__ seq_lens,
    const int32_t* __restrict__ block_tables, const int32_t* __restrict__ tiles, int max_blocks, int block_size, int H,
    int KVH, float scale, float* __restrict__ out) {
  using L = Smem<D>;
  constexpr int R = L::rows, kGroups = R / 16, kShare = kPrefillWarps / kGroups;
  // A warp's part of its 16-row group: key tiles of S, rows of the softmax, 16-column tiles of O.
  constexpr int kKeyTiles = kPrefillKeys / 16 / kShare, kSoftmaxRows = 16 / kShare, kOutTiles = D / 16 / kShare;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* Qs = reinterpret_cast<__half*>(smem + L::q);
  __half* Ks = reinterpret_cast<__half*>(smem + L::k);
  __half* Vs = reinterpret_cast<__half*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  __half* Ps = reinterpret_cast<__half*>(smem + L::p);
  float* Os = reinterpret_cast<float*>(smem + L::o);
  float* row_m = reinterpret_cast<float*>(smem + L::m);
  float* row_l = reinterpret_cast<float*>(smem + L::l);

  const int s = tiles[2 * blockIdx.x], r0 = tiles[2 * blockIdx.x + 1], h = blockIdx.y, kvh = h / (H / KVH);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp % kGroups, part = warp / kGroups;
  const int q_begin = query_start[s], q_len = query_start[s + 1] - q_begin;
  const int rows = min(R, q_len - r0);
  const int p0 = seq_lens[s] - q_len + r0;  // absolute position of this tile's first row
  const int n_keys = p0 + rows;
  const int32_t* table = block_tables + size_t(s) * max_blocks;

  for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    Qs[r * L::ldq + d] = __float2half_rn(r < rows ? q[(size_t(q_begin + r0 + r) * H + h) * D + d] : 0.0f);
    Os[r * L::ldo + d] = 0.0f;
  }
  for (int r = threadIdx.x; r < R; r += blockDim.x) row_m[r] = -INFINITY, row_l[r] = 0.0f;

  for (int k0 = 0; k0 < n_keys; k0 += kPrefillKeys) {
    __syncthreads();  // the previous tile's K/V are no longer read
    stage_keys<C, D>(kc, vc, sc, table, block_size, KVH, kvh, k0, n_keys, Ks, Vs);
    __syncthreads();

    // S[16 rows of the group][this warp's key tiles] = Q K^T
    for (int jj = 0; jj < kKeyTiles; ++jj) {
      const int j = part * kKeyTiles + jj;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
        wmma::load_matrix_sync(a, Qs + 16 * group * L::ldq + 16 * kk, L::ldq);
        wmma::load_matrix_sync(b, Ks + 16 * j * L::ldq + 16 * kk, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Ss + 16 * group * L::lds + 16 * j, acc, L::lds, wmma::mem_row_major);
    }
    sync_group<kShare>();

    // Online softmax, one row at a time, one key per lane.
    for (int r = 0; r < kSoftmaxRows; ++r) {
      const int i = 16 * group + part * kSoftmaxRows + r, j = k0 + lane;
      const bool valid = i < rows && j <= p0 + i;
      const float sc = valid ? Ss[i * L::lds + lane] * scale : -INFINITY;
      float mx = sc;
      mx = warp_max(mx);
      const float m_old = row_m[i], m_new = fmaxf(m_old, mx);
      const float p = valid ? __expf(sc - m_new) : 0.0f;
      const float corr = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
      float sum = p;
      sum = warp_sum(sum);
      Ps[i * L::ldp + lane] = __float2half_rn(p);
      for (int d = lane; d < D; d += 32) Os[i * L::ldo + d] *= corr;
      __syncwarp();
      if (lane == 0) row_m[i] = m_new, row_l[i] = row_l[i] * corr + sum;
    }
    sync_group<kShare>();

    // O[16 rows][this warp's columns] += P[16][32] V[32][columns]
    for (int cc = 0; cc < kOutTiles; ++cc) {
      const int c = part * kOutTiles + cc;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, Os + 16 * group * L::ldo + 16 * c, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kPrefillKeys / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(a, Ps + 16 * group * L::ldp + 16 * kk, L::ldp);
        wmma::load_matrix_sync(b, Vs + 16 * kk * L::ldq + 16 * c, L::ldq);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(Os + 16 * group * L::ldo + 16 * c, acc, L::ldo, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    out[(size_t(q_begin + r0 + r) * H + h) * D + d] = Os[r * L::ldo + d] / row_l[r];
  }
}

template <typename C, int D>
void launch(const float* q, const C* kc, const C* vc, const KvScales& sc, const int32_t* qs, const int32_t* lens,
            const int32_t* tables, const int32_t* tiles, int n_tiles, int max_blocks, int block_size, int H, int KVH,
            float scale, float* out) {
  constexpr size_t bytes = Smem<D>::bytes;
  static PerDevice configure;
  configure([] {
    RV_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<C, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  });
  prefill_kernel<C, D><<<dim3(unsigned(n_tiles), unsigned(H)), kPrefillWarps * 32, bytes, stream()>>>(
      q, kc, vc, sc, qs, lens, tables, tiles, max_blocks, block_size, H, KVH, scale, out);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace prefill

template <typename C>
void launch_prefill(const float* q, const C* kc, const C* vc, const KvScales& sc, const int32_t* qs, const int32_t* lens,
                    const int32_t* tables, const int32_t* tiles, int n_tiles, int max_blocks, int block_size, int H,
                    int KVH, int D, float scale, float* out) {
  auto go = [&](auto kernel_d) {
    prefill::launch<C, decltype(kernel_d)::value>(q, kc, vc, sc, qs, lens, tables, tiles, n_tiles, max_blocks, block_size,
                                                  H, KVH, scale, out);
  };
  if (D == 64) go(std::integral_constant<int, 64>{});
  else if (D == 128) go(std::integral_constant<int, 128>{});
  else go(std::integral_constant<int, 256>{});
}

}  // namespace revolta::cuda
