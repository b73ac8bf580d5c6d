// The CUDA backend: kernels for the SM70 instruction set (fp32/fp16 math, no bf16 arithmetic,
// no cp.async/ldmatrix), registered as the op table of Device::kCUDA.
#pragma once

#include <string>

#include "core/tensor.h"
#include "ops/ops.h"

namespace revolta::cuda {

const ops::OpTable* table();

// Copies between host and device memory (synchronous).
Tensor to_device(const Tensor& host);
Tensor to_host(const Tensor& device);
void synchronize();
// Device-to-device copy bandwidth (read + write bytes per second) over a buffer of `bytes`.
double measure_copy_bandwidth(size_t bytes);
std::string device_name();

void embedding(const Tensor& ids, const Tensor& table, Tensor& out);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void silu_mul(const Tensor& gate_up, Tensor& out);
void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const ops::RopeTables& tables);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& batch,
                     float scale, Tensor& out);
void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache);

}  // namespace revolta::cuda
