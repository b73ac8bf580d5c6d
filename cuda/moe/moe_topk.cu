// MoE routing on the device: one warp per token; softmax statistics over the experts (up to any
// count, 512 for Qwen3-Next), then K rounds of a warp arg-max over the probabilities, each
// excluding what earlier rounds took (ties to the lower expert id, as on the CPU).
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void moe_topk_kernel(const float* __restrict__ logits, int64_t T, int E, int K, bool renorm,
                                int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;
  const float* l = logits + t * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += __expf(l[e] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  // Rank by logit (the softmax is monotonic); (value desc, id asc), below the previous pick.
  float pv = INFINITY;
  int pi = -1;
  float top = 0.0f;
  for (int k = 0; k < K; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = l[e];
      const bool below = v < pv || (v == pv && e > pi);
      if (below && (v > bv || (v == bv && e < bi))) bv = v, bi = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    const float p = __expf(bv - mx) / sum;
    if (lane == 0) ids[t * K + k] = bi, weights[t * K + k] = p;
    top += p;
    pv = bv, pi = bi;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[t * K + k] /= top;
}

}  // namespace

void moe_topk(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), E = logits.size(1), K = ids.size(1);
  if (T == 0) return;
  moe_topk_kernel<<<unsigned((T + kWarps - 1) / kWarps), 32 * kWarps, 0, stream()>>>(
      logits.ptr<float>(), T, int(E), int(K), renormalize, ids.ptr<int32_t>(), weights.ptr<float>());
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
