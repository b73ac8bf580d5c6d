// The SM70 tensor-core instruction's peak on the GPU at hand: mma.sync.m8n8k4 f16 x f16, with f32
// or f16 accumulators, from registers only (no memory traffic). A later GPU runs the instruction
// for compatibility, slower than its own tensor-core shapes: the fair compute limit of an SM70
// build, which benchmarks set beside the read bandwidth (revolta_bench's SM70 roofline).
#include <cuda_fp16.h>
#include <mma.h>

#include <functional>

#include "core/cuda_check.h"
#include "cuda_ops.h"

namespace revolta::cuda {
namespace {

constexpr int kChains = 4;         // independent accumulators a warp keeps in flight
constexpr int kIterations = 4096;  // mma rounds a warp runs

// A warp's m8n8k4 is four 8x8x4 products (its four quad pairs): 2 * 8 * 8 * 4 * 4 FLOPs.
constexpr double kFlopsPerMma = 2.0 * 8 * 8 * 4 * 4;

template <bool kF32>
__global__ void mma884_kernel(float* sink, unsigned seed) {
  const unsigned a0 = seed ^ threadIdx.x, a1 = a0 * 3u, b0 = a0 * 5u, b1 = a0 * 7u;
  if constexpr (kF32) {
    float c[kChains][8] = {};
    for (int i = 0; i < kIterations; ++i)
#pragma unroll
      for (int j = 0; j < kChains; ++j)
        asm volatile(
            "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, {%10,%11}, "
            "{%0,%1,%2,%3,%4,%5,%6,%7};"
            : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3]), "+f"(c[j][4]), "+f"(c[j][5]), "+f"(c[j][6]),
              "+f"(c[j][7])
            : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kChains; ++j)
#pragma unroll
      for (int e = 0; e < 8; ++e) s += c[j][e];
    if (s == 1234.5f) *sink = s;  // keeps the products; (almost) never true
  } else {
    unsigned c[kChains][4] = {};
    for (int i = 0; i < kIterations; ++i)
#pragma unroll
      for (int j = 0; j < kChains; ++j)
        asm volatile(
            "mma.sync.aligned.m8n8k4.row.col.f16.f16.f16.f16 {%0,%1,%2,%3}, {%4,%5}, {%6,%7}, {%0,%1,%2,%3};"
            : "+r"(c[j][0]), "+r"(c[j][1]), "+r"(c[j][2]), "+r"(c[j][3])
            : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
    unsigned s = 0;
#pragma unroll
    for (int j = 0; j < kChains; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s ^= c[j][e];
    if (s == 0x12345678u) *sink = float(s);
  }
}

// wmma m16n16k16 f16 with f32 accumulators, the shape the engine's GEMMs are written in: on SM70
// it becomes m8n8k4 instructions, on a later GPU its own tensor-core shapes.
__global__ void wmma_kernel(float* sink) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[kChains];
  wmma::fill_fragment(a, __float2half(0.001f * float(threadIdx.x & 7)));
  wmma::fill_fragment(b, __float2half(0.002f));
  for (int j = 0; j < kChains; ++j) wmma::fill_fragment(c[j], 0.0f);
  for (int i = 0; i < kIterations; ++i)
#pragma unroll
    for (int j = 0; j < kChains; ++j) wmma::mma_sync(c[j], a, b, c[j]);
  float s = 0.0f;
  for (int j = 0; j < kChains; ++j)
    for (int e = 0; e < c[j].num_elements; ++e) s += c[j].x[e];
  if (s == 1234.5f) *sink = s;
}

double run_peak(const std::function<void(float*, unsigned, unsigned)>& launch, double flops_per_warp_round) {
  Tensor sink = Tensor::empty({1}, DType::kF32, Device::kCUDA);
  const unsigned blocks = unsigned(sm_count() * 4), threads = 256;
  auto run = [&] { launch(sink.ptr<float>(), blocks, threads); };
  run();
  RV_CUDA_CHECK(cudaGetLastError());
  const int reps = 5;
  const float ms = stream_ms(run, reps);
  const double warps = double(blocks) * threads / 32;
  return warps * kIterations * kChains * flops_per_warp_round * reps / (double(ms) / 1e3);
}

}  // namespace

double measure_wmma_flops() {
  return run_peak([](float* sink, unsigned blocks, unsigned threads) { wmma_kernel<<<blocks, threads, 0, stream()>>>(sink); },
                  2.0 * 16 * 16 * 16);
}

double measure_mma884_flops(bool f32_accumulate) {
  return run_peak(
      [&](float* sink, unsigned blocks, unsigned threads) {
        if (f32_accumulate) mma884_kernel<true><<<blocks, threads, 0, stream()>>>(sink, 17u);
        else mma884_kernel<false><<<blocks, threads, 0, stream()>>>(sink, 17u);
      },
      kFlopsPerMma);
}

}  // namespace revolta::cuda
