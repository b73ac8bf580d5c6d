// The CUDA backend: kernels for the SM70 instruction set (fp32/fp16 math, no bf16 arithmetic,
// no cp.async/ldmatrix), registered as the op table of Device::kCUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace revolta::cuda {

const ops::OpTable* table();
// The stream every kernel and copy of the backend runs on (graphs are recorded from it).
cudaStream_t stream();
int sm_count();
// Blocks of `kernel` resident at once per multiprocessor with `threads` per block and `smem` bytes
// of dynamic shared memory, asked of the runtime once per triple (decode steps ask it per layer).
int blocks_per_sm(const void* kernel, int threads, size_t smem);

// Copies between host and device memory (to_host waits for the data).
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& device);
void synchronize();
// Device-to-device copy bandwidth (read + write bytes per second) over a buffer of `bytes`.
double measure_copy_bandwidth(size_t bytes);
// Streaming-read bandwidth (float4 loads over a buffer of `bytes`): the decode roofline's denominator.
double measure_read_bandwidth(size_t bytes);
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

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const ops::NormInto* norm = nullptr);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void silu_mul(const Tensor& gate_up, Tensor& out);
void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out);
void linear_scaled(const Tensor& x, const ops::GroupScale& scale, const Tensor& weight, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const ops::RopeTables& tables);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& batch,
                     float scale, Tensor& out, const ops::OutputGate* gate = nullptr);
void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache);
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out);
void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst);
void transpose(const Tensor& x, Tensor& out);
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi);
void argmax(const Tensor& x, Tensor& out);
void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, int32_t chunk_size);
void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                   const Tensor& seq_slots, Tensor& out, bool silu);
void l2_norm(Tensor& x, int64_t dim, float eps);
void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out);
void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column);
void gdn_gates(const Tensor& fused, int64_t first_column, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta,
               Tensor& g);
void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y);
void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate);
void moe_topk(const Tensor& logits, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights);
void moe_route(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights,
               const ops::ResidualNorm* first);
void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v);
void gdn_decode(const Tensor* x, Tensor& fused, const ops::GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& experts, Tensor& out,
                 const ops::ResidualNorm* then);
void moe_route_experts(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize,
                       const ops::ResidualNorm& first, Tensor& ids, Tensor& weights, const ops::ExpertTable& experts,
                       Tensor& out, const ops::ResidualNorm* then, const Tensor* warm);
void sample(const Tensor& logits, const std::vector<ops::SampleRow>& rows, const std::vector<ops::SampleAdjust>& adjust,
            std::vector<ops::SampleResult>& out);
void qkv_rope_cache(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache);
void qkv_rope_attention(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const ops::AttentionBatch& batch, float scale, Tensor& out, const ops::OutputGate* gate);

}  // namespace revolta::cuda
