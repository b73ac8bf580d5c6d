// moe_experts over 4-bit group experts (moe_experts_int4.cu), for moe_experts.cu.
#pragma once

#include "ops/ops.h"

namespace revolta::cuda {

bool is_int4_table(const ops::ExpertTable& ex);
// Decode-sized batches: the gate / up and down kernels (and `then`'s residual norm).
void moe_experts_int4(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& ex, Tensor& out,
                      const ops::ResidualNorm* then);
// The experts with counts[e] > 0 dequantized to f16 into `scratch`, as a table of that ([2 inter,
// hidden] and [hidden, inter] matrices, down not transposed) for the grouped GEMMs.
ops::ExpertTable dequantize_used_experts(const ops::ExpertTable& ex, const Tensor& counts, Tensor& scratch);

}  // namespace revolta::cuda
