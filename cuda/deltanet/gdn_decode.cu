// ops::gdn_decode on the device: a DeltaNet block from its fused projection to its normed output in
// one kernel for decode batches (the separate conv, split / L2 norm, gates, delta rule and gated
// norm kernels of a decode step were each latency-bound).
//
// A block per (key head, sequence) owns every channel that key head's conv touches (its q and k
// heads and the v heads of its value heads), so it alone reads and writes those conv states.
// 16 warps: per value head of the group, 4 column groups of 32 state columns x RG row groups;
// each thread keeps RPT rows of its column of the fp32 state in registers (the recurrent form of
// gated_delta_rule.cu). Per token: conv + silu into shared memory, q / k L2 norms and the gates,
// the rule, then the gated RMSNorm over the value head's columns.
#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32, kMaxChannels = kThreads, kMaxW = 8;
// State rows a thread may hold. Under clang (the SM70 lane) the 64-row form spills ~800 bytes per
// thread and measured slower than the separate kernels (H200 running the lane's PTX, Qwen3-Next
// 32 layers at concurrency 1: 322 vs 364 tok/s); nvcc's build keeps it in registers.
#if defined(__clang__)
constexpr int kMaxRowsPerThread = 32;
#else
constexpr int kMaxRowsPerThread = 64;
#endif

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

struct Shape {
  int Hk, Dk, Hv, Dv, W, width, C;
};

template <int RPT, int RG>  // RPT state rows per thread, RG row groups; 4 / RG value heads per key head
__global__ void __launch_bounds__(kThreads)
    gdn_decode_kernel(const float* __restrict__ fused, const float* __restrict__ conv_w, const float* __restrict__ neg_a,
                      const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float norm_eps,
                      float* __restrict__ conv_states, float* __restrict__ states, const int32_t* __restrict__ starts,
                      const int32_t* __restrict__ slots, float* __restrict__ out, Shape sh) {
  constexpr int R = 4 / RG;  // value heads per key head
  const int Dk = RPT * RG, Dv = sh.Dv, hk = blockIdx.x, s = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j = warp / (4 * RG), cg = (warp / RG) % 4, rg = warp % RG;  // value head in group, column group, row group
  const int h = hk * R + j, col = cg * 32 + lane;
  const bool has_col = col < Dv;
  __shared__ float xq[256], xk[256], xv[R][128];  // this token's conv outputs (Dk <= 256, Dv <= 128)
  __shared__ float red[kWarps][32];
  __shared__ float scal[2 + 2 * R];  // 1 / |q| * scale, 1 / |k|, then beta and the decay per value head
  __shared__ float norm_part[R][4];
  const int t0 = starts[s], t1 = starts[s + 1], slot = slots[s];
  if (slot < 0) {  // a padding row: no state, zero output
    for (int t = t0; t < t1; ++t)
      if (rg == 0 && has_col) out[size_t(t) * sh.Hv * Dv + h * Dv + col] = 0.0f;
    return;
  }
  // The conv channel this thread owns: q head hk, k head hk, then the R v heads.
  const int nq = Dk, nch = 2 * Dk + R * Dv;
  const int c_local = threadIdx.x;
  int channel = -1;
  if (c_local < nq) channel = hk * Dk + c_local;
  else if (c_local < 2 * nq) channel = sh.Hk * Dk + hk * Dk + (c_local - nq);
  else if (c_local < nch) channel = 2 * sh.Hk * Dk + hk * R * Dv + (c_local - 2 * nq);
  // The channel's last W - 1 inputs live in shared memory (registers go to the state).
  __shared__ float window[kMaxChannels][kMaxW - 1];
  float* win = window[c_local];
  const float* wc = conv_w + size_t(max(channel, 0)) * sh.W;
  float* cst = channel >= 0 ? conv_states + (size_t(slot) * sh.C + channel) * (sh.W - 1) : nullptr;
  if (channel >= 0)
    for (int i = 0; i < sh.W - 1; ++i) win[i] = cst[i];
  float* S = states + (size_t(slot) * sh.Hv + h) * Dk * Dv;
  float st[RPT];
#pragma unroll
  for (int r = 0; r < RPT; ++r) st[r] = has_col ? S[size_t(rg * RPT + r) * Dv + col] : 0.0f;
  const float scale = rsqrtf(float(Dk));
  for (int t = t0; t < t1; ++t) {
    const float* row = fused + size_t(t) * sh.width;
    if (channel >= 0) {  // conv + silu, window shifted
      const float xt = row[channel];
      float acc = wc[sh.W - 1] * xt;
      for (int i = 0; i < sh.W - 1; ++i) acc += wc[i] * win[i];
      for (int i = 0; i + 1 < sh.W - 1; ++i) win[i] = win[i + 1];
      if (sh.W > 1) win[sh.W - 2] = xt;
      const float y = silu(acc);
      if (c_local < nq) xq[c_local] = y;
      else if (c_local < 2 * nq) xk[c_local - nq] = y;
      else xv[(c_local - 2 * nq) / Dv][(c_local - 2 * nq) % Dv] = y;
    }
    __syncthreads();
    if (warp < 2) {  // L2 norms of q (warp 0) and k (warp 1)
      const float* x = warp == 0 ? xq : xk;
      float ss = 0.0f;
      for (int i = lane; i < Dk; i += 32) ss += x[i] * x[i];
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) scal[warp] = rsqrtf(ss + 1e-6f) * (warp == 0 ? scale : 1.0f);
    } else if (warp == 2 && lane < R) {  // the gates of value head hk * R + lane
      const int hv = hk * R + lane;
      const int first = sh.C + sh.Hv * Dv;  // b columns, then a
      scal[2 + lane] = 1.0f / (1.0f + __expf(-row[first + hv]));
      scal[2 + R + lane] = __expf(neg_a[hv] * softplus(row[first + sh.Hv + hv] + dt_bias[hv]));
    }
    __syncthreads();
    const float qn = scal[0], kn = scal[1], b = scal[2 + j], decay = scal[2 + R + j];
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      st[r] *= decay;
      part += xk[rg * RPT + r] * kn * st[r];
    }
    red[warp][lane] = part;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int g = 0; g < RG; ++g) kv += red[warp - rg + g][lane];
    const float delta = has_col ? (xv[j][col] - kv) * b : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
      st[r] += xk[rg * RPT + r] * kn * delta;
      o += xq[rg * RPT + r] * qn * st[r];
    }
    __syncthreads();  // red is read by everyone
    red[warp][lane] = o;
    __syncthreads();
    float out_v = 0.0f;
    if (rg == 0) {
#pragma unroll
      for (int g = 0; g < RG; ++g) out_v += red[warp + g][lane];
      float ss = has_col ? out_v * out_v : 0.0f;
      for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      if (lane == 0) norm_part[j][cg] = ss;
    }
    __syncthreads();
    if (rg == 0 && has_col) {
      const float total = norm_part[j][0] + norm_part[j][1] + norm_part[j][2] + norm_part[j][3];
      const float inv = rsqrtf(total / float(Dv) + norm_eps);
      const float z = row[sh.C + h * Dv + col];
      out[size_t(t) * sh.Hv * Dv + h * Dv + col] = norm_w[col] * (out_v * inv) * silu(z);
    }
    __syncthreads();  // shared buffers are rewritten by the next token
  }
  if (channel >= 0)
    for (int i = 0; i < sh.W - 1; ++i) cst[i] = win[i];
#pragma unroll
  for (int r = 0; r < RPT; ++r)
    if (has_col) S[size_t(rg * RPT + r) * Dv + col] = st[r];
}

}  // namespace

void gdn_decode(const Tensor& fused, const ops::GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out) {
  const int64_t T = fused.size(0), Hv = w.neg_a->numel(), Dv = w.norm->numel(), Dk = states.size(2);
  const int64_t C = w.conv->size(0), W = w.conv->size(1), Hk = (C - Hv * Dv) / (2 * Dk), S = seq_slots.numel();
  RV_CHECK(Hk > 0 && C == 2 * Hk * Dk + Hv * Dv && fused.size(1) >= C + Hv * Dv + 2 * Hv && Hv % Hk == 0,
           "CUDA gdn_decode: fused ", fused.shape_str(), " conv ", w.conv->shape_str(), " states ", states.shape_str());
  if (T == 0 || S == 0) return;
  const int64_t R = Hv / Hk;
  // The one-kernel form: one or two value heads per key head, the key head's channels within one
  // thread each, the state columns within 4 groups of 32 and the rows within the registers.
  const bool fits = (R == 1 || R == 2) && Dv <= 128 && Dk % (4 / R) == 0 && 2 * Dk + R * Dv <= kMaxChannels &&
                    Dk * R / 4 <= kMaxRowsPerThread && W <= kMaxW && w.norm->dtype() == DType::kF32;
  auto composition = [&] {
    Tensor conv_out = Tensor::uninitialized({T, C}, DType::kF32, Device::kCUDA);
    Tensor q = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, Device::kCUDA), k = Tensor::uninitialized({T, Hk, Dk}, DType::kF32, Device::kCUDA);
    Tensor v = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, Device::kCUDA), core = Tensor::uninitialized({T, Hv, Dv}, DType::kF32, Device::kCUDA);
    Tensor g = Tensor::uninitialized({T, Hv}, DType::kF32, Device::kCUDA), beta = Tensor::uninitialized({T, Hv}, DType::kF32, Device::kCUDA);
    causal_conv1d(fused, *w.conv, conv_states, seq_starts, seq_slots, conv_out, true);
    gdn_split_qkv(conv_out, 1e-6f, q, k, v);
    gdn_gates(fused, C + Hv * Dv, *w.neg_a, *w.dt_bias, beta, g);
    gated_delta_rule(q, k, v, g, beta, states, seq_starts, seq_slots, core, 64);
    gated_rms_norm(core, fused, C, *w.norm, w.norm_eps, out);
  };
  const Shape sh{int(Hk), int(Dk), int(Hv), int(Dv), int(W), int(fused.size(1)), int(C)};
  const dim3 grid{unsigned(Hk), unsigned(S)};
  auto go = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream()>>>(fused.ptr<float>(), w.conv->ptr<float>(), w.neg_a->ptr<float>(),
                                            w.dt_bias->ptr<float>(), w.norm->ptr<float>(), w.norm_eps,
                                            conv_states.ptr<float>(), states.ptr<float>(), seq_starts.ptr<int32_t>(),
                                            seq_slots.ptr<int32_t>(), out.ptr<float>(), sh);
  };
  const int64_t rows = Dk * R / 4;  // state rows per thread
  if (!fits) composition();
#if !defined(__clang__)
  else if (R == 2 && rows == 64) go(gdn_decode_kernel<64, 2>);
  else if (R == 1 && rows == 64) go(gdn_decode_kernel<64, 4>);
#endif
  else if (R == 2 && rows == 32) go(gdn_decode_kernel<32, 2>);
  else if (R == 2 && rows == 16) go(gdn_decode_kernel<16, 2>);
  else if (R == 2 && rows == 8) go(gdn_decode_kernel<8, 2>);
  else if (R == 1 && rows == 32) go(gdn_decode_kernel<32, 4>);
  else if (R == 1 && rows == 16) go(gdn_decode_kernel<16, 4>);
  else if (R == 1 && rows == 8) go(gdn_decode_kernel<8, 4>);
  else if (R == 1 && rows == 4) go(gdn_decode_kernel<4, 4>);
  else composition();
  RV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace revolta::cuda
