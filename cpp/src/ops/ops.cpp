#include "ops/ops.h"

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops {
namespace cpu {
const OpTable* table();
}

namespace {

const OpTable* g_tables[2] = {cpu::table(), nullptr};
thread_local ThreadPool* t_pool = nullptr;
thread_local int t_block_activation_bits = 16;

const OpTable& table_for(Device d, Op op) {
  const OpTable* t = g_tables[int(d)];
  RV_CHECK(t != nullptr && supports_op(d, op), "op ", op_name(op), " has no implementation for ",
           d == Device::kCPU ? "the CPU" : "CUDA", " in this build");
  return *t;
}

// Gated attention's output gate, f32 columns of one row per token (paged_attention and its fused form).
void check_output_gate(const char* op, const Tensor& q, const OutputGate* gate) {
  RV_CHECK(!gate || (gate->gate->dim() == 2 && gate->gate->size(0) == q.size(0) &&
                     gate->column + q.size(1) * q.size(2) <= gate->gate->size(1) && gate->gate->dtype() == DType::kF32),
           op, ": an output gate f32 [T, >= column + heads * head_dim] (got ",
           gate ? gate->gate->shape_str() : std::string(), " from column ", gate ? gate->column : 0, ")");
}

// A quantized cache comes with its scales (int8: f32 [num_blocks, block_size, kv_heads] a side), a float one without.
void check_kv_quant(const char* op, const Tensor& cache, const KvQuant* quant) {
  const DType t = cache.dtype();
  const bool quantized = t == DType::kF8E4M3 || t == DType::kI8;
  const auto rows_fit = [&](const Tensor& r) {
    return r.defined() && r.dtype() == DType::kF32 && r.device() == cache.device() && r.dim() == 3 &&
           r.size(0) == cache.size(0) && r.size(1) == cache.size(1) && r.size(2) == cache.size(2);
  };
  RV_CHECK((t == DType::kF32 || t == DType::kF16 || quantized) && quantized == (quant != nullptr) &&
               (t != DType::kI8 || (rows_fit(quant->k_rows) && rows_fit(quant->v_rows))),
           op, ": a KV cache of float32 or float16, or of float8_e4m3 / int8 with its KvQuant (int8: f32 scales ",
           "[num_blocks, block_size, kv_heads] on its device); got ", dtype_name(t), " ", cache.shape_str(),
           quant ? " with" : " without", " scales");
}

// Positions int32 [T], or [T, A] with an axis per rotary frequency (RopeTables::axes).
void check_rope_positions(const char* op, int64_t T, const Tensor& positions, const RopeTables& tables) {
  const bool multi = tables.axes.defined();
  RV_CHECK(positions.dtype() == DType::kI32 && positions.size(0) == T && positions.dim() == (multi ? 2 : 1) &&
               (!multi || (tables.axes.numel() == tables.rotary_dim / 2 && tables.axes.dtype() == DType::kI32 &&
                           tables.axes.device() == positions.device())),
           op, ": positions int32 [", T, multi ? ", axes]" : "]", " (got ", positions.shape_str(), ")");
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
#define REVOLTA_OP_NAME(Name, function, ...) \
  case Op::k##Name:                          \
    return #function;
    REVOLTA_OPS(REVOLTA_OP_NAME)
#undef REVOLTA_OP_NAME
    case Op::kCount:
      break;
  }
  return "?";
}

void register_backend(Device device, const OpTable* table) { g_tables[int(device)] = table; }

bool supports_op(Device device, Op op) {
  const OpTable* t = g_tables[int(device)];
  if (!t) return false;
  switch (op) {
#define REVOLTA_OP_SUPPORTED(Name, function, ...) \
  case Op::k##Name:                               \
    return t->function != nullptr;
    REVOLTA_OPS(REVOLTA_OP_SUPPORTED)
#undef REVOLTA_OP_SUPPORTED
    case Op::kCount:
      break;
  }
  return false;
}

bool supports_op(Device device, Op op, const OpShape& shape) {
  if (!supports_op(device, op)) return false;
  const OpTable* t = g_tables[int(device)];
  return !t->takes || t->takes(op, shape);
}

void set_cpu_thread_pool(ThreadPool* pool) { t_pool = pool; }
ThreadPool* cpu_thread_pool() { return t_pool; }
void set_cpu_block_activation_bits(int bits) { t_block_activation_bits = bits; }
int cpu_block_activation_bits() { return t_block_activation_bits; }

void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const NormInto* norm) {
  RV_CHECK(!norm || (norm->weight->numel() == table.size(1) && norm->weight->dtype() == DType::kF32 &&
                     norm->normed->numel() == out.numel() && norm->normed->dtype() == DType::kF32),
           "embedding: a norm weight f32 [", table.size(1), "] and a normed tensor like out ", out.shape_str());
  table_for(out.device(), Op::kEmbedding).embedding(ids, table, out, norm);
}
void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out) {
  RV_CHECK(first_id >= 0 && out.numel() == ids.numel() * table.size(1) && out.dtype() == DType::kF32,
           "embedding_shard: out f32 [", ids.numel(), ", ", table.size(1), "], got ", out.shape_str());
  table_for(out.device(), Op::kEmbeddingShard).embedding_shard(ids, table, first_id, out);
}

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  table_for(x.device(), Op::kRmsNorm).rms_norm(x, weight, eps, out);
}
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor& out) {
  table_for(x.device(), Op::kAddRmsNorm).add_rms_norm(residual, x, weight, eps, out);
}
void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  table_for(x.device(), Op::kLinear).linear(x, weight, bias, out);
}
void linear_scaled(const Tensor& x, const GroupScale& scale, const Tensor& weight, Tensor& out) {
  const Tensor* sq = scale.squares;
  RV_CHECK(sq && x.dim() == 2 && x.dtype() == DType::kF32 && x.is_contiguous() && sq->dim() == 3 &&
               sq->dtype() == DType::kF32 && sq->is_contiguous() && sq->size(0) == x.size(0) && sq->size(1) > 0 &&
               x.size(1) % sq->size(1) == 0 && sq->device() == x.device(),
           "linear_scaled: x f32 [T, K] and GroupScale::squares f32 [T, groups, parts] on its device, groups dividing K (got x ",
           x.shape_str(), ", squares ", sq ? sq->shape_str() : std::string("none"), ")");
  table_for(x.device(), Op::kLinearScaled).linear_scaled(x, scale, weight, out);
}
void rope(Tensor& x, const Tensor& positions, const RopeTables& tables) {
  check_rope_positions("rope", x.size(0), positions, tables);
  table_for(x.device(), Op::kRope).rope(x, positions, tables);
}
void silu_mul(const Tensor& gate_up, Tensor& out) {
  table_for(gate_up.device(), Op::kSiluMul).silu_mul(gate_up, out);
}
void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                    Tensor& v_cache, const KvQuant* quant) {
  check_kv_quant("kv_cache_write", k_cache, quant);
  table_for(k.device(), Op::kKvCacheWrite).kv_cache_write(k, v, slot_mapping, k_cache, v_cache, quant);
}
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate, const KvQuant* quant) {
  check_output_gate("paged_attention", q, gate);
  check_kv_quant("paged_attention", k_cache, quant);
  table_for(q.device(), Op::kPagedAttention)
      .paged_attention(q, k_cache, v_cache, batch, scale, out, gate, quant);
}
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  table_for(x.device(), Op::kGatherRows).gather_rows(x, rows, out);
}
void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst) {
  table_for(src.device(), Op::kCopyColumns).copy_columns(src, first_column, dst);
}
void transpose(const Tensor& x, Tensor& out) {
  RV_CHECK(x.dim() == 2 && out.dim() == 2 && out.size(0) == x.size(1) && out.size(1) == x.size(0) &&
               out.dtype() == x.dtype() && (dtype_size(x.dtype()) == 2 || dtype_size(x.dtype()) == 4) &&
               x.is_contiguous() && out.is_contiguous() && out.device() == x.device(),
           "transpose: x [R, C] and out [C, R], contiguous, of one 2- or 4-byte dtype on one device (got ",
           dtype_name(x.dtype()), " x of ", x.dim(), " dims and ", dtype_name(out.dtype()), " out of ", out.dim(), ")");
  table_for(x.device(), Op::kTranspose).transpose(x, out);
}
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& at) {
  table_for(t.device(), Op::kFillUniform).fill_uniform(t, seed, lo, hi, at);
}
void argmax(const Tensor& x, Tensor& out) { table_for(x.device(), Op::kArgmax).argmax(x, out); }
void qkv_rope_cache(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache, const KvQuant* quant) {
  check_kv_quant("qkv_rope_cache", k_cache, quant);
  check_rope_positions("qkv_rope_cache", qkv.size(0), positions, rope);
  table_for(qkv.device(), Op::kQkvRopeCache)
      .qkv_rope_cache(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, quant);
}
void qkv_rope_attention(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate,
                        const KvQuant* quant) {
  check_output_gate("qkv_rope_attention", q, gate);
  check_kv_quant("qkv_rope_attention", k_cache, quant);
  check_rope_positions("qkv_rope_attention", qkv.size(0), positions, rope);
  table_for(qkv.device(), Op::kQkvRopeAttention)
      .qkv_rope_attention(qkv, norm, positions, rope, slot_mapping, q, k_cache, v_cache, batch, scale, out, gate, quant);
}

void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act) {
  table_for(x.device(), Op::kLinearSwiglu).linear_swiglu(x, gate_up_weight, act);
}
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, int32_t chunk_size) {
  table_for(q.device(), Op::kGatedDeltaRule)
      .gated_delta_rule(q, k, v, g, beta, states, seq_starts, seq_slots, out, chunk_size);
}
void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                   const Tensor& seq_slots, Tensor& out, bool silu) {
  table_for(x.device(), Op::kCausalConv1d).causal_conv1d(x, weight, conv_states, seq_starts, seq_slots, out, silu);
}
void l2_norm(Tensor& x, int64_t dim, float eps) { table_for(x.device(), Op::kL2Norm).l2_norm(x, dim, eps); }
void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out) {
  table_for(x.device(), Op::kGatedRmsNorm).gated_rms_norm(x, gate, gate_column, weight, eps, out);
}
void group_rms_norm(const Tensor& x, const Tensor& weight, int64_t group, float eps, Tensor& out) {
  RV_CHECK(x.dim() == 2 && group > 0 && x.size(1) % group == 0 && weight.numel() == x.size(1) && out.numel() == x.numel(),
           "group_rms_norm: x [T, G * ", group, "], weight [G * ", group, "], out like x (got ", x.shape_str(), ", ",
           weight.shape_str(), ", ", out.shape_str(), ")");
  table_for(x.device(), Op::kGroupRmsNorm).group_rms_norm(x, weight, group, eps, out);
}
void scaled_silu(const Tensor& x, int64_t columns, float scale, Tensor& out) {
  RV_CHECK(x.dim() == 2 && columns <= x.size(1) && out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == columns,
           "scaled_silu: out [T, ", columns, "] of x ", x.shape_str(), " (got ", out.shape_str(), ")");
  table_for(x.device(), Op::kScaledSilu).scaled_silu(x, columns, scale, out);
}
void hc_mix(const Tensor& normed, const Tensor& mix_logits, Tensor& out) {
  RV_CHECK(normed.dim() == 2 && mix_logits.shape() == normed.shape() && out.dim() == 2 && out.size(0) == normed.size(0) &&
               normed.size(1) % out.size(1) == 0,
           "hc_mix: normed and mix_logits [T, hc * E], out [T, E] (got ", normed.shape_str(), ", ", mix_logits.shape_str(),
           ", ", out.shape_str(), ")");
  table_for(out.device(), Op::kHcMix).hc_mix(normed, mix_logits, out);
}
void hc_combine(Tensor& streams, const Tensor& y, const Tensor& logits, int64_t column, float scale) {
  RV_CHECK(streams.dim() == 2 && y.dim() == 2 && y.size(0) == streams.size(0) && streams.size(1) % y.size(1) == 0 &&
               logits.dim() == 2 && logits.size(0) == y.size(0) && column + streams.size(1) / y.size(1) <= logits.size(1),
           "hc_combine: streams [T, hc * E], y [T, E], logits [T, >= column + hc] (got ", streams.shape_str(), ", ",
           y.shape_str(), ", ", logits.shape_str(), " from column ", column, ")");
  table_for(streams.device(), Op::kHcCombine).hc_combine(streams, y, logits, column, scale);
}
void accumulate(Tensor& out, const Tensor& x) {
  RV_CHECK(out.numel() == x.numel(), "accumulate: out ", out.shape_str(), " and x ", x.shape_str(), " differ");
  table_for(out.device(), Op::kAccumulate).accumulate(out, x);
}
void ngram_rows(const Tensor& ids, const NgramHash& hash, Tensor& windows, const Tensor& seq_starts,
                const Tensor& seq_slots, Tensor& rows) {
  const int64_t heads = int64_t(hash.ngram_size - 1) * hash.heads_per_ngram;
  RV_CHECK(rows.dim() == 2 && rows.size(0) == ids.numel() && rows.size(1) == heads && rows.dtype() == DType::kI32 &&
               windows.dim() == 2 && windows.size(1) == hash.ngram_size - 1,
           "ngram_rows: rows int32 [T, ", heads, "], windows [slots, ", hash.ngram_size - 1, "] (got ", rows.shape_str(),
           ", ", windows.shape_str(), ")");
  table_for(ids.device(), Op::kNgramRows).ngram_rows(ids, hash, windows, seq_starts, seq_slots, rows);
}
void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, Tensor& out) {
  RV_CHECK(key.dim() == 2 && query.shape() == key.shape() && out.shape() == key.shape() && value.dim() == 2 &&
               value.size(0) == key.size(0) && key.size(1) % value.size(1) == 0,
           "ple_gate: key, query, out [T, hc * E], value [T, E] (got ", key.shape_str(), ", ", query.shape_str(), ", ",
           value.shape_str(), ", ", out.shape_str(), ")");
  table_for(key.device(), Op::kPleGate).ple_gate(key, query, value, out);
}
void token_rows_write(const Tensor& x, const Tensor& slot_mapping, Tensor& cache) {
  RV_CHECK(x.dim() == 2 && cache.dim() == 3 && cache.size(2) == x.size(1) && slot_mapping.numel() == x.size(0),
           "token_rows_write: x [T, W] into a cache [blocks, block_size, W] (got ", x.shape_str(), ", ", cache.shape_str(), ")");
  table_for(cache.device(), Op::kTokenRowsWrite).token_rows_write(x, slot_mapping, cache);
}
void qsa_select(const Tensor& q, const Tensor& key_rows, const QsaIndex& index, const AttentionBatch& batch,
                Tensor& blocks) {
  RV_CHECK(q.dim() == 3 && key_rows.dim() == 3 && key_rows.size(2) == q.size(2) && index.ratio > 0 && index.k_norm &&
               index.rope && blocks.dim() == 2 && blocks.size(0) == q.size(0) && blocks.dtype() == DType::kI32,
           "qsa_select: q [T, heads, D], key rows [blocks, block_size, D], blocks int32 [T, top], ratio > 0 (got ",
           q.shape_str(), ", ", key_rows.shape_str(), ", ", blocks.shape_str(), ", ratio ", index.ratio, ")");
  table_for(q.device(), Op::kQsaSelect).qsa_select(q, key_rows, index, batch, blocks);
}
void qsa_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                   const Tensor& blocks, int32_t ratio, float scale, Tensor& out, const OutputGate* gate,
                   const KvQuant* quant) {
  check_output_gate("qsa_attention", q, gate);
  check_kv_quant("qsa_attention", k_cache, quant);
  RV_CHECK(ratio > 0 && blocks.dim() == 2 && blocks.size(0) == q.size(0), "qsa_attention: blocks [T, top] and ratio > 0");
  table_for(q.device(), Op::kQsaAttention).qsa_attention(q, k_cache, v_cache, batch, blocks, ratio, scale, out, gate, quant);
}
void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column) {
  table_for(x.device(), Op::kSigmoidMul).sigmoid_mul(x, gate, gate_column);
}
void gdn_gates(const Tensor& fused, int64_t first_column, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta,
               Tensor& g) {
  table_for(fused.device(), Op::kGdnGates).gdn_gates(fused, first_column, neg_a, dt_bias, beta, g);
}
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out) {
  const int64_t n = weight.numel();
  RV_CHECK(n > 0 && bias.numel() == n && x.numel() % n == 0 && out.numel() == x.numel() && x.dtype() == DType::kF32 &&
               weight.dtype() == DType::kF32 && bias.dtype() == DType::kF32,
           "layer_norm: x f32 [.., ", n, "], weight and bias f32 [", n, "] (got ", x.shape_str(), ", ",
           weight.shape_str(), ", ", bias.shape_str(), ")");
  table_for(x.device(), Op::kLayerNorm).layer_norm(x, weight, bias, eps, out);
}
void gelu(Tensor& x, bool tanh_approximation) {
  RV_CHECK(x.dtype() == DType::kF32, "gelu: f32 values (got ", dtype_name(x.dtype()), ")");
  table_for(x.device(), Op::kGelu).gelu(x, tanh_approximation);
}
void scatter_rows(Tensor& out, const Tensor& rows, const Tensor& src) {
  RV_CHECK(out.dim() == 2 && src.dim() == 2 && src.size(1) == out.size(1) && rows.numel() == src.size(0) &&
               rows.dtype() == DType::kI32 && rows.device() == out.device() && src.device() == out.device(),
           "scatter_rows: out [T, C], src [R, C], rows int32 [R] on one device (got ", out.shape_str(), ", ",
           src.shape_str(), ", ", rows.shape_str(), ")");
  table_for(out.device(), Op::kScatterRows).scatter_rows(out, rows, src);
}
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts, int32_t max_seq_len,
                      float scale, Tensor& out) {
  RV_CHECK(q.dim() == 3 && k.shape() == q.shape() && v.shape() == q.shape() && out.shape() == q.shape() &&
               seq_starts.dtype() == DType::kI32 && seq_starts.numel() >= 2 && max_seq_len > 0,
           "varlen_attention: q, k, v, out [T, heads, head_dim], seq_starts int32 [S + 1] (got ", q.shape_str(), ", ",
           k.shape_str(), ", ", v.shape_str(), ", ", out.shape_str(), ", ", seq_starts.shape_str(), ")");
  table_for(q.device(), Op::kVarlenAttention).varlen_attention(q, k, v, seq_starts, max_seq_len, scale, out);
}
void dynamic_conv(const Tensor& x, const Tensor& dynamic, int64_t column, int64_t groups, const Tensor& base,
                  const Tensor& first_row, Tensor& out) {
  const int64_t R = x.dim() == 2 ? x.size(0) : -1, C = x.dim() == 2 ? x.size(1) : 0;
  const int64_t K = base.dim() == 2 ? base.size(0) : 0;
  RV_CHECK(R >= 0 && out.shape() == x.shape() && base.dim() == 2 && base.size(1) == C && K > 0 && groups > 0 &&
               C % groups == 0 && dynamic.dim() == 2 && dynamic.size(0) == R && column >= 0 &&
               dynamic.size(1) >= column + K * groups && first_row.dtype() == DType::kI32 && first_row.numel() == R &&
               x.data() != out.data(),
           "dynamic_conv: x, out [R, C] (distinct), base [K, C], dynamic [R, >= column + K * groups], first_row int32 [R] "
           "(got ", x.shape_str(), ", ", base.shape_str(), ", ", dynamic.shape_str(), ", ", first_row.shape_str(),
           ", groups ", groups, ", column ", column, ")");
  table_for(x.device(), Op::kDynamicConv).dynamic_conv(x, dynamic, column, groups, base, first_row, out);
}
void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y) {
  table_for(out.device(), Op::kScatterAddRows).scatter_add_rows(out, rows, weights, y);
}
void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate) {
  table_for(out.device(), Op::kAddGatedRows).add_gated_rows(out, y, gate);
}
void moe_topk(const Tensor& logits, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights) {
  table_for(logits.device(), Op::kMoeTopk).moe_topk(logits, num_experts, renormalize, ids, weights);
}

void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v) {
  table_for(mixed.device(), Op::kGdnSplitQkv).gdn_split_qkv(mixed, eps, q, k, v);
}

namespace {
void check_route_first(const Tensor& x, const ResidualNorm* first, const char* op) {
  RV_CHECK(!first || (first->residual->shape() == x.shape() && first->normed->shape() == x.shape() &&
                      first->weight->numel() == x.size(1)),
           op, ": residual, normed [T, hidden] like x and a norm weight [hidden] (got x ", x.shape_str(),
           first ? ", residual " + first->residual->shape_str() + ", normed " + first->normed->shape_str() +
                       ", weight " + first->weight->shape_str()
                 : std::string(), ")");
}
}  // namespace

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& experts, Tensor& out,
                 const ResidualNorm* then) {
  table_for(x.device(), Op::kMoeExperts).moe_experts(x, ids, weights, experts, out, then);
}
void moe_route(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, Tensor& ids,
               Tensor& weights, const ResidualNorm* first) {
  check_route_first(x, first, "moe_route");
  table_for(x.device(), Op::kMoeRoute).moe_route(x, router, num_experts, renormalize, ids, weights, first);
}
void moe_route_experts(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize,
                       const ResidualNorm& first, Tensor& ids, Tensor& weights, const ExpertTable& experts, Tensor& out,
                       const ResidualNorm* then, const Tensor* warm) {
  check_route_first(x, &first, "moe_route_experts");
  RV_CHECK(out.shape() == x.shape() && ids.shape() == weights.shape() && ids.size(0) == x.size(0),
           "moe_route_experts: out like x ", x.shape_str(), " and ids, weights [T, slots] (got out ", out.shape_str(),
           ", ids ", ids.shape_str(), ", weights ", weights.shape_str(), ")");
  table_for(x.device(), Op::kMoeRouteExperts)
      .moe_route_experts(x, router, num_experts, renormalize, first, ids, weights, experts, out, then, warm);
}
void gdn_decode(const Tensor* x, Tensor& fused, const GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares) {
  RV_CHECK(!x || w.proj, "gdn_decode: an input x needs the input projection (GdnWeights::proj)");
  const int64_t Hv = w.neg_a->numel(), parts = (w.norm->numel() + 31) / 32;
  RV_CHECK(!squares || (squares->dtype() == DType::kF32 && squares->is_contiguous() && squares->dim() == 3 &&
                        squares->size(0) == fused.size(0) && squares->size(1) == Hv && squares->size(2) == parts &&
                        squares->device() == fused.device()),
           "gdn_decode: squares f32 [T, value heads, ceil(value head dim / 32)] = [", fused.size(0), ", ", Hv, ", ", parts,
           "] on fused's device (got ", squares ? squares->shape_str() : std::string(), ")");
  RV_CHECK(!x || (x->dim() == 2 && x->size(0) == fused.size(0) && w.proj->size(0) == fused.size(1) &&
                  w.proj->size(1) == x->size(1)),
           "gdn_decode: x [T, hidden], GdnWeights::proj [width, hidden] and fused [T, width] (got x ",
           x ? x->shape_str() : "", ", proj ", x ? w.proj->shape_str() : "", ", fused ", fused.shape_str(), ")");
  table_for(fused.device(), Op::kGdnDecode)
      .gdn_decode(x, fused, w, conv_states, states, seq_starts, seq_slots, out, squares);
}
void sample(const Tensor& logits, const std::vector<SampleRow>& rows, const std::vector<SampleAdjust>& adjust,
            std::vector<SampleResult>& out) {
  table_for(logits.device(), Op::kSample).sample(logits, rows, adjust, out);
}

std::vector<float> sample_weights(const float* logits, int64_t vocab, const SampleRow& row, const SampleAdjust* adjust) {
  return cpu::sample_weights(logits, vocab, row, adjust);
}

int32_t draw_index_order(const std::vector<float>& weights, double uniform) { return cpu::draw_index_order(weights, uniform); }

}  // namespace revolta::ops
