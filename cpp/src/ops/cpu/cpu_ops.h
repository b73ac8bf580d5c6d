// CPU implementations of the op table (see ops/ops.h for the contracts).
#pragma once

#include <functional>

#include "ops/ops.h"

namespace revolta::ops::cpu {

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const NormInto* norm = nullptr);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const RopeTables& tables);
void silu_mul(const Tensor& gate_up, Tensor& out);
void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                    Tensor& v_cache);
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate = nullptr);
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out);
void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst);
void transpose(const Tensor& x, Tensor& out);
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi);
void argmax(const Tensor& x, Tensor& out);
void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act);
void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column);
void gdn_gates(const Tensor& fused, int64_t first_column, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta,
               Tensor& g);
void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y);
void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate);
void moe_topk(const Tensor& logits, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights);
void moe_route(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights,
               const ResidualNorm* first = nullptr);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& experts, Tensor& out,
                 const ResidualNorm* then);
void moe_route_experts(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize,
                       const ResidualNorm& first, Tensor& ids, Tensor& weights, const ExpertTable& experts, Tensor& out,
                       const ResidualNorm* then, const Tensor* warm = nullptr);
void sample(const Tensor& logits, const std::vector<SampleRow>& rows, const std::vector<SampleAdjust>& adjust,
            std::vector<SampleResult>& out);
void qkv_rope_cache(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache);
void qkv_rope_attention(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate);

// Gated DeltaNet pieces (see gated_delta_rule.cpp). chunk_size <= 1 selects the recurrent form.
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, Tensor& out, int32_t chunk_size);
void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_state, Tensor& out, bool silu);
// The batched forms of the op table (ops.h): the per-sequence functions above over each sequence.
void gated_delta_rule_seqs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                           Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out,
                           int32_t chunk_size);
void causal_conv1d_seqs(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                        const Tensor& seq_slots, Tensor& out, bool silu);
void l2_norm(Tensor& x, int64_t dim, float eps);
void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v);
void gdn_decode(const Tensor* x, Tensor& fused, const GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares = nullptr);
void linear_scaled(const Tensor& x, const GroupScale& scale, const Tensor& weight, Tensor& out);
void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out);

// Runs fn(task) for every task in [0, n) on the current CPU pool, or inline when there is none.
void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over [0, n) on the current CPU pool, or inline when there is none.
void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace revolta::ops::cpu
