// From the fused projection qkv [T, (H + 2 KVH) * D]: q normed (optional) and rotated into q
// [T, H, D]; k normed and rotated and v written straight to their cache slots (in the cache's
// format: kv_elements.cuh). One
// block per token and four heads, one warp per head through a shared-memory row (rotate-half pairs
// can sit in different lanes). Replaces split + two norms + two ropes + a cache write: six
// launches per layer in a decode step.
#include "attention/kv_elements.cuh"
#include "core/cuda_check.h"
#include "core/launch.cuh"
#include "core/probe.cuh"
#include "core/warp_reduce.cuh"
#include "cuda_ops.h"

namespace revolta::cuda {
RV_PROBE_TU();
namespace {

constexpr int kWarps = 4, kMaxD = 256;

// A head per warp (the grid covers every head once). Before the wait the lane loads what no kernel
// in flight writes (the batch layout, the norm weight, the rope tables at its token's position), so
// that after it one round trip is left: its loads of the head's row, all in flight together.
template <typename C>
__global__ void qkv_rope_cache_kernel(const float* __restrict__ qkv, const float* __restrict__ q_norm,
                                      const float* __restrict__ k_norm, float eps, const int32_t* __restrict__ pos,
                                      const int32_t* __restrict__ axes, int num_axes,
                                      const float* __restrict__ cos_t, const float* __restrict__ sin_t, int half,
                                      const int32_t* __restrict__ slots, float* __restrict__ q, C* __restrict__ kc,
                                      C* __restrict__ vc, int H, int KVH, int D, int64_t row_width, float inv_k,
                                      float inv_v, float* __restrict__ k_rows, float* __restrict__ v_rows) {
  constexpr int kPer = kMaxD / 32;
  RV_PROBE_BLOCK(ProbeKind::kQkvRopeCache);
  __shared__ float buf[kWarps][kMaxD];
  const int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y * kWarps + warp;
  const int64_t slot = slots[t];
  const bool is_q = h < H, is_k = !is_q && h < H + KVH;
  const float* w = is_q ? q_norm : is_k ? k_norm : nullptr;
  float wv[kPer], cv[kPer], sv[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = lane + 32 * i;
    const bool turns = (is_q || is_k) && d < half;
    // multimodal RoPE: frequency d turns by its axis's position
    const int64_t at = turns ? int64_t(pos[int64_t(t) * num_axes + (axes ? axes[d] : 0)]) * half + d : 0;
    wv[i] = w && d < D ? w[d] : 1.0f;
    cv[i] = turns ? cos_t[at] : 0.0f;
    sv[i] = turns ? sin_t[at] : 0.0f;
  }
  enter_dependent();
  RV_PROBE_MARK(1);
  if (h >= H + 2 * KVH || (!is_q && slot < 0)) return;  // a padding row writes no cache slot
  const float* row = qkv + int64_t(t) * row_width + int64_t(h) * D;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) v[i] = lane + 32 * i < D ? row[lane + 32 * i] : 0.0f;
  if (w) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) ss += v[i] * v[i];
    const float r = rsqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[i] = v[i] * r * wv[i];
  }
  float* b = buf[warp];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + 32 * i < D) b[lane + 32 * i] = v[i];
  __syncwarp();
  if (is_q || is_k) {  // rotate-half pairs (d, d + half) can sit in different lanes
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int d = lane + 32 * i;
      if (d >= half) continue;
      const float x1 = b[d], x2 = b[d + half];
      b[d] = x1 * cv[i] - x2 * sv[i];
      b[d + half] = x2 * cv[i] + x1 * sv[i];
    }
    __syncwarp();
  }
  if (is_q) {
    for (int d = lane; d < D; d += 32) q[(int64_t(t) * H + h) * D + d] = b[d];
  } else {
    const int64_t at = slot * KVH + (is_k ? h - H : h - H - KVH);
    store_row_warp((is_k ? kc : vc) + at * D, is_k ? k_rows + at : v_rows + at, b, D, is_k ? inv_k : inv_v);
  }
}

template <typename C>
void launch(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
            const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const ops::KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  const float* qn = norm.q ? norm.q->ptr<float>() : nullptr;
  const float* kn = norm.k ? norm.k->ptr<float>() : nullptr;
  float* k_rows = quant && quant->k_rows.defined() ? quant->k_rows.ptr<float>() : nullptr;
  float* v_rows = quant && quant->v_rows.defined() ? quant->v_rows.ptr<float>() : nullptr;
  const dim3 grid{unsigned(T), unsigned((H + 2 * KVH + kWarps - 1) / kWarps)};
  launch_dependent(qkv_rope_cache_kernel<C>, grid, dim3(32 * kWarps), 0, qkv.ptr<float>(), qn, kn, norm.eps,
                   positions.ptr<int32_t>(), rope.axes.defined() ? rope.axes.ptr<int32_t>() : nullptr,
                   rope.axes.defined() ? int(positions.size(1)) : 1, rope.cos.ptr<float>(), rope.sin.ptr<float>(), rope.rotary_dim / 2,
                   slot_mapping.ptr<int32_t>(), q.ptr<float>(), k_cache.ptr<C>(), v_cache.ptr<C>(), int(H), int(KVH), int(D),
                   qkv.size(1), quant ? 1.0f / quant->k : 1.0f, quant ? 1.0f / quant->v : 1.0f, k_rows, v_rows);
}

}  // namespace

void qkv_rope_cache(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const ops::KvQuant* quant) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(2);
  RV_CHECK(D <= kMaxD && qkv.size(1) >= (H + 2 * KVH) * D, "CUDA qkv_rope_cache: head_dim ", D, " (<= ", kMaxD,
           "), qkv ", qkv.shape_str());
  if (T == 0) return;
  switch (k_cache.dtype()) {
    case DType::kF32: launch<float>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant); break;
    case DType::kF16: launch<__half>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant); break;
    case DType::kF8E4M3: launch<Fp8>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant); break;
    case DType::kI8: launch<int8_t>(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant); break;
    default: throw std::invalid_argument("CUDA qkv_rope_cache: no kernel for a " + std::string(dtype_name(k_cache.dtype())) + " cache");
  }
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
