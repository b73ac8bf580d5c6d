// CPU implementations of the op table (see ops/ops.h for the contracts).
#pragma once

#include <functional>

#include "ops/ops.h"

namespace revolta::ops::cpu {

// Every op of the table (ops/op_list.h).
REVOLTA_OPS(REVOLTA_DECLARE_OP)

// Gated DeltaNet over one sequence (gated_delta_rule.cpp; the table ops run them over each
// sequence). chunk_size <= 1 selects the recurrent form.
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, Tensor& out, int32_t chunk_size);
void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_state, Tensor& out, bool silu);

// The sampler's semantics on one row (the reference form of ops::sample): at temperature 0 the
// adjusted logits; else the kept tokens' unnormalised probabilities after temperature, top-k,
// top-p and min-p (0: dropped). The speculative verifier reads target distributions from it.
std::vector<float> sample_weights(const float* raw, int64_t V, const SampleRow& row, const SampleAdjust* adjust);
// The token at `uniform` of the weights' mass, walking the kept tokens in index order.
int32_t draw_index_order(const std::vector<float>& weights, double uniform);

// out[M, N] = x[M, K] . w^T for w in 32-value blocks (Q4_0, Q4_1, Q8_0) with 8-bit integer dot
// products over x quantized per block (linear_blocks.cpp); false (nothing done) for other
// formats or without AVX2.
bool linear_blocks_int8(const float* x, int64_t M, int64_t K, const Tensor& w, int64_t N, float* out);

// Runs fn(task) for every task in [0, n) on the current CPU pool, or inline when there is none.
void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over [0, n) on the current CPU pool, or inline when there is none.
void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace revolta::ops::cpu
