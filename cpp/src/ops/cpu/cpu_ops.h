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

// Runs fn(task) for every task in [0, n) on the current CPU pool, or inline when there is none.
void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over [0, n) on the current CPU pool, or inline when there is none.
void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace revolta::ops::cpu
