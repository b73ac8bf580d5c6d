// MoE routing on the device: one warp per token; softmax statistics over the experts, then K
// rounds of a warp arg-max over the probabilities, each excluding what earlier rounds took (ties
// to the lower expert id, as on the CPU). Up to 512 experts (Qwen3-Next) the logits stay in
// registers; more are read again each round.
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kWarps = 4;

__global__ void moe_topk_kernel(const float* __restrict__ logits, int64_t T, int E, int K, int S, bool renorm,
                                int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;
  const float* l = logits + t * (E + S);
  const int KS = K + S;  // ids / weights row: K routed slots, then the shared expert
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
    if (lane == 0) ids[t * KS + k] = bi, weights[t * KS + k] = p;
    top += p;
    pv = bv, pi = bi;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[t * KS + k] /= top;
  if (S && lane == 0) ids[t * KS + K] = E, weights[t * KS + K] = 1.0f / (1.0f + __expf(-l[E]));
}

// Up to 32 x N experts: each lane keeps its logits in registers and a mask of what earlier rounds
// took, so the K rounds do not re-read memory (at decode sizes the rounds are the cost).
template <int N>
__global__ void moe_topk_registers_kernel(const float* __restrict__ logits, int64_t T, int E, int K, int S,
                                          bool renorm, int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int64_t t = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T) return;
  const float* l = logits + t * (E + S);
  const int KS = K + S;  // ids / weights row: K routed slots, then the shared expert
  float v[N];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i < E) sum += __expf(v[i] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  uint32_t taken = 0;  // bit i: expert lane + 32 i was picked (or does not exist)
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (lane + 32 * i >= E) taken |= 1u << i;
  float top = 0.0f;
  for (int k = 0; k < K; ++k) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < N; ++i)  // this lane's candidates rise in id: ties keep the first
      if (!(taken >> i & 1u) && (bi == 0x7fffffff || v[i] > bv)) bv = v[i], bi = lane + 32 * i;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i == bi) taken |= 1u << i;
    const float p = __expf(bv - mx) / sum;
    if (lane == 0) ids[t * KS + k] = bi, weights[t * KS + k] = p;
    top += p;
  }
  if (renorm && lane == 0)
    for (int k = 0; k < K; ++k) weights[t * KS + k] /= top;
  if (S && lane == 0) ids[t * KS + K] = E, weights[t * KS + K] = 1.0f / (1.0f + __expf(-l[E]));
}

}  // namespace

void moe_topk(const Tensor& logits, int64_t E, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), S = logits.size(1) - E, K = ids.size(1) - S;
  RV_CHECK((S == 0 || S == 1) && K >= 1 && K <= E, "CUDA moe_topk: logits ", logits.shape_str(), " for ", E,
           " experts, ids ", ids.shape_str());
  if (T == 0) return;
  const unsigned blocks = unsigned((T + kWarps - 1) / kWarps);
  auto go = [&](auto kernel) {
    kernel<<<blocks, 32 * kWarps, 0, stream()>>>(logits.ptr<float>(), T, int(E), int(K), int(S), renormalize,
                                                 ids.ptr<int32_t>(), weights.ptr<float>());
  };
  if (E <= 32 * 4) go(moe_topk_registers_kernel<4>);
  else if (E <= 32 * 16) go(moe_topk_registers_kernel<16>);
  else go(moe_topk_kernel);
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
