// The CUDA backend: kernels for the SM70 instruction set (fp32/fp16 math, no bf16 arithmetic,
// no cp.async/ldmatrix), registered as the op table of Device::kCUDA.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace revolta::cuda {

const ops::OpTable* table();
// The calling thread's device (0 unless use_device chose another: a tensor-parallel rank's thread
// works on GPU `rank`). Streams, memory pools and staging buffers are the device's own.
int current_device();
void use_device(int device);
// The stream every kernel and copy of the backend runs on, the calling thread's device's (graphs
// are recorded from it).
cudaStream_t stream();
// Per-device setup a call site does once per device (a kernel's shared-memory opt-in is a device's
// attribute): `static PerDevice once; once([] { cudaFuncSetAttribute(...); });`.
class PerDevice {
 public:
  template <typename F>
  void operator()(F&& setup) {
    const uint64_t bit = uint64_t(1) << current_device();
    if (done_.load(std::memory_order_acquire) & bit) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (done_.load() & bit) return;
    setup();
    done_.fetch_or(bit);
  }

 private:
  std::mutex mu_;
  std::atomic<uint64_t> done_{0};
};
int sm_count();
// Blocks of `kernel` resident at once per multiprocessor with `threads` per block and `smem` bytes
// of dynamic shared memory, asked of the runtime once per triple (decode steps ask it per layer).
int blocks_per_sm(const void* kernel, int threads, size_t smem);

// A piece of a batched host <-> device copy: its offset in a staging buffer (which holds the
// table of pieces first), its device address and size. move_pieces copies every piece between the
// device copy of that staging buffer and its address, one thread block a piece.
struct PieceRef {
  uint64_t staged, device, bytes;
};
void move_pieces(const PieceRef* refs, int64_t count, uint8_t* staged, bool to_device);

// Copies between host and device memory (to_host waits for the data).
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& device);
void synchronize();
// Milliseconds of `reps` calls of run() on the stream, between two events (the measurements below).
float stream_ms(const std::function<void()>& run, int reps);
// Device-to-device copy bandwidth (read + write bytes per second) over a buffer of `bytes`.
double measure_copy_bandwidth(size_t bytes);
// Streaming-read bandwidth (float4 loads over a buffer of `bytes`): the decode roofline's denominator.
double measure_read_bandwidth(size_t bytes);
// FLOP/s of mma.sync.m8n8k4 (f16 inputs; f32 or f16 accumulators) from registers (core/peaks.cu):
// the tensor-core peak of SM70 code on this GPU.
double measure_mma884_flops(bool f32_accumulate);
// Peak of wmma m16n16k16 f16 (f32 accumulators), the shape the engine's GEMMs use.
double measure_wmma_flops();
std::string device_name();
// Whether decode kernels are launched so that each may start while its predecessor drains
// (core/launch.cuh; compute capability 9.0+ with a build for it). On by default; benchmarks turn
// it off to measure what it gives.
void set_dependent_launch(bool allowed);
// True when this device and this build support it and it was not turned off.
bool dependent_launch_enabled();
// Phase timestamps of the decode kernels, in a build configured with -DREVOLTA_PROBE=ON
// (core/probe.cuh): kind (which kernel), point (which phase), block, global timer in ns.
struct ProbeRecord {
  uint16_t kind, point;
  uint32_t block;
  uint64_t time_ns;
};
// Starts the log (before the first kernel; a build without the probes logs nothing), and takes the
// records logged so far (the log is then emptied).
void probe_enable();
std::vector<ProbeRecord> probe_take();

// Every op of the table (ops/op_list.h).
REVOLTA_OPS(REVOLTA_DECLARE_OP)

// linear's 4-bit group weights (gemm/linear_int4.cu), and their f16 copy [N, K] for the GEMM.
void linear_int4(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out);
void dequantize_int4(const Tensor& weight, Tensor& out);

}  // namespace revolta::cuda
