// The op list, written once. Each entry is X(Name, function, signature): from it come the Op enum
// and op_name (ops.cpp), the OpTable's function pointers and supports_op (ops.h, ops.cpp), each
// backend's declarations (ops/cpu/cpu_ops.h, cuda/cuda_ops.h) and its table. A backend function
// missing, or of another signature, is a compile error. The contracts live with the dispatching
// functions in ops.h; an op is added by one entry here, its contract there and one implementation
// per backend.
#pragma once

#define REVOLTA_OPS(X)                                                                                               \
  X(Embedding, embedding, void(const Tensor& ids, const Tensor& table, Tensor& out, const ops::NormInto* norm))      \
  X(EmbeddingShard, embedding_shard, void(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out))    \
  X(RmsNorm, rms_norm, void(const Tensor& x, const Tensor& weight, float eps, Tensor& out))                          \
  X(AddRmsNorm, add_rms_norm, void(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out)) \
  X(Linear, linear, void(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out))                    \
  X(LinearScaled, linear_scaled,                                                                                     \
    void(const Tensor& x, const ops::GroupScale& scale, const Tensor& weight, Tensor& out))                          \
  X(LinearSwiglu, linear_swiglu, void(const Tensor& x, const Tensor& gate_up_weight, Tensor& act))                   \
  X(Rope, rope, void(Tensor& x, const Tensor& positions, const ops::RopeTables& tables))                             \
  X(SiluMul, silu_mul, void(const Tensor& gate_up, Tensor& out))                                                     \
  X(KvCacheWrite, kv_cache_write,                                                                                    \
    void(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache,             \
         const ops::KvQuant* quant))                                                                                 \
  X(PagedAttention, paged_attention,                                                                                 \
    void(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& batch, float scale, \
         Tensor& out, const ops::OutputGate* gate, const ops::KvQuant* quant))                                       \
  X(QkvRopeCache, qkv_rope_cache,                                                                                    \
    void(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,           \
         const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const ops::KvQuant* quant))        \
  X(QkvRopeAttention, qkv_rope_attention,                                                                            \
    void(const Tensor& qkv, const ops::QkNorm& norm, const Tensor& positions, const ops::RopeTables& rope,           \
         const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const ops::AttentionBatch& batch,  \
         float scale, Tensor& out, const ops::OutputGate* gate, const ops::KvQuant* quant))                          \
  X(GatherRows, gather_rows, void(const Tensor& x, const Tensor& rows, Tensor& out))                                 \
  X(CopyColumns, copy_columns, void(const Tensor& src, int64_t first_column, Tensor& dst))                           \
  X(Transpose, transpose, void(const Tensor& x, Tensor& out))                                                        \
  X(FillUniform, fill_uniform, void(Tensor& t, uint64_t seed, float lo, float hi, const ops::FillWindow& at))        \
  X(Argmax, argmax, void(const Tensor& x, Tensor& out))                                                              \
  X(Sample, sample,                                                                                                  \
    void(const Tensor& logits, const std::vector<ops::SampleRow>& rows, const std::vector<ops::SampleAdjust>& adjust, \
         std::vector<ops::SampleResult>& out))                                                                       \
  X(GatedDeltaRule, gated_delta_rule,                                                                                \
    void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& states,     \
         const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, int32_t chunk_size))                        \
  X(CausalConv1d, causal_conv1d,                                                                                     \
    void(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,                       \
         const Tensor& seq_slots, Tensor& out, bool silu))                                                           \
  X(L2Norm, l2_norm, void(Tensor& x, int64_t dim, float eps))                                                        \
  X(GatedRmsNorm, gated_rms_norm,                                                                                    \
    void(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out))    \
  X(SigmoidMul, sigmoid_mul, void(Tensor& x, const Tensor& gate, int64_t gate_column))                               \
  X(GdnGates, gdn_gates,                                                                                             \
    void(const Tensor& fused, int64_t first_column, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta,        \
         Tensor& g))                                                                                                 \
  X(GdnSplitQkv, gdn_split_qkv, void(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v))               \
  X(GdnDecode, gdn_decode,                                                                                           \
    void(const Tensor* x, Tensor& fused, const ops::GdnWeights& w, Tensor& conv_states, Tensor& states,              \
         const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares))                           \
  X(ScatterAddRows, scatter_add_rows, void(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y)) \
  X(AddGatedRows, add_gated_rows, void(Tensor& out, const Tensor& y, const Tensor& gate))                            \
  X(MoeTopk, moe_topk,                                                                                               \
    void(const Tensor& logits, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights))                 \
  X(MoeRoute, moe_route,                                                                                             \
    void(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights, \
         const ops::ResidualNorm* first))                                                                            \
  X(MoeExperts, moe_experts,                                                                                         \
    void(const Tensor& x, const Tensor& ids, const Tensor& weights, const ops::ExpertTable& experts, Tensor& out,    \
         const ops::ResidualNorm* then))                                                                             \
  X(MoeRouteExperts, moe_route_experts,                                                                              \
    void(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, const ops::ResidualNorm& first, \
         Tensor& ids, Tensor& weights, const ops::ExpertTable& experts, Tensor& out, const ops::ResidualNorm* then,  \
         const Tensor* warm))                                                                                        \
  /* vision encoders */                                                                                               \
  X(LayerNorm, layer_norm, void(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out))  \
  X(Gelu, gelu, void(Tensor& x, bool tanh_approximation))                                                           \
  X(ScatterRows, scatter_rows, void(Tensor& out, const Tensor& rows, const Tensor& src))                             \
  X(VarlenAttention, varlen_attention,                                                                               \
    void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts, int32_t max_seq_len,           \
         float scale, Tensor& out))                                                                                  \
  /* DFlash2 drafts */                                                                                                \
  X(DynamicConv, dynamic_conv,                                                                                       \
    void(const Tensor& x, const Tensor& dynamic, int64_t column, int64_t groups, const Tensor& base,                 \
         const Tensor& first_row, Tensor& out))                                                                      \
  /* Flash-Next: hyper-connections, n-gram PLE, QSA */                                                               \
  X(GroupRmsNorm, group_rms_norm, void(const Tensor& x, const Tensor& weight, int64_t group, float eps, Tensor& out)) \
  X(ScaledSilu, scaled_silu, void(const Tensor& x, int64_t columns, float scale, Tensor& out))                       \
  X(HcMix, hc_mix, void(const Tensor& normed, const Tensor& mix_logits, Tensor& out))                                \
  X(HcCombine, hc_combine,                                                                                           \
    void(Tensor& streams, const Tensor& y, const Tensor& logits, int64_t column, float scale))                       \
  X(Accumulate, accumulate, void(Tensor& out, const Tensor& x))                                                      \
  X(NgramRows, ngram_rows,                                                                                           \
    void(const Tensor& ids, const ops::NgramHash& hash, Tensor& windows, const Tensor& seq_starts,                   \
         const Tensor& seq_slots, Tensor& rows))                                                                     \
  X(PleGate, ple_gate, void(const Tensor& key, const Tensor& query, const Tensor& value, Tensor& out))               \
  X(TokenRowsWrite, token_rows_write, void(const Tensor& x, const Tensor& slot_mapping, Tensor& cache))              \
  X(QsaSelect, qsa_select,                                                                                           \
    void(const Tensor& q, const Tensor& key_rows, const ops::QsaIndex& index, const ops::AttentionBatch& batch,      \
         Tensor& blocks))                                                                                            \
  X(QsaAttention, qsa_attention,                                                                                     \
    void(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionBatch& batch,            \
         const Tensor& blocks, int32_t ratio, float scale, Tensor& out, const ops::OutputGate* gate,                 \
         const ops::KvQuant* quant))

// A backend's declarations: `void name(...);` for every op, in the backend's namespace.
#define REVOLTA_DECLARE_OP(Name, function, ...)                                                                      \
  using function##_signature = __VA_ARGS__;                                                                          \
  function##_signature function;

// A backend's table: every entry points at the backend's function of that name.
#define REVOLTA_TABLE_ENTRY(Name, function, ...) table.function = &function;
