// The op table. Each op is declared once here; every backend registers an implementation per
// device, and a call dispatches on the device of its first tensor. A backend that lacks an op
// reports it through supports_op(), so the engine can refuse a configuration at startup.
//
// Conventions: activations are float32 row-major [tokens, features]; weights may be f32/f16/bf16
// and are [out_features, in_features] like HF's nn.Linear.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "ops/op_list.h"

namespace revolta {
class ThreadPool;
}

namespace revolta::ops {

// Describes the sequences of one batch for paged attention. Tokens of sequence s occupy rows
// [query_start[s], query_start[s+1]) of q; they are the last tokens of a context of seq_lens[s]
// tokens whose K/V live in the blocks listed in block_tables[s * max_blocks_per_seq ...].
struct AttentionBatch {
  const int32_t* query_start = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t block_size = 0;
  // Device mirrors, set by a runner that keeps the metadata in device memory (null: a device
  // backend uploads the host arrays itself). dev_token_seq[t] is the sequence of token row t.
  // max_seq_len bounds seq_lens (it sizes the work split); decode_only promises tokens_per_seq
  // query tokens per sequence (1, or a speculative verify step's last token and its drafts), so a
  // captured graph never depends on the host arrays.
  const int32_t* dev_query_start = nullptr;
  const int32_t* dev_seq_lens = nullptr;
  const int32_t* dev_block_tables = nullptr;
  const int32_t* dev_token_seq = nullptr;
  int32_t max_seq_len = 0;
  bool decode_only = false;
  int32_t tokens_per_seq = 1;
};

// The scales of a quantized KV cache layer (kv_cache_dtype fp8 / int8; the float caches pass
// none). E4M3 caches: x = e4m3 * k (K) or * v (V), one scale per layer, values past 448 scale
// saturate. Int8 caches: x = q * s, s one float per (slot, KV head) in k_rows / v_rows, f32
// [num_blocks, block_size, kv_heads] on the cache's device, written with the values (absmax / 127).
struct KvQuant {
  float k = 1.0f, v = 1.0f;
  Tensor k_rows, v_rows;
};

// RoPE cos/sin tables, [max_positions, rotary_dim / 2] each, already multiplied by the
// attention scaling of the rope type (YaRN). With axes (int32 [rotary_dim / 2] on the op's device),
// positions are int32 [T, A], one per axis, and frequency i of token t turns by the position of axis
// axes[i] (multimodal RoPE: time / height / width sections; a vision encoder's height / width).
struct RopeTables {
  Tensor cos, sin;
  int32_t rotary_dim = 0;
  Tensor axes;
};

// PLE's n-gram hashing (Flash-Next): for token t with window ctx[0] = t, ctx[j] = the token j back
// (EOS where that token, or one between, is EOS or before the sequence), n-gram n = 2..ngram_size
// hashes to m = XOR_{j < n} ctx[j] * multipliers[j], and its heads_per_ngram heads read table row
// m mod sizes[h] + offsets[h] (h = (n - 2) * heads_per_ngram + i). int64 tensors on the op's device.
struct NgramHash {
  Tensor multipliers, sizes, offsets;  // [ngram_size], [heads], [heads]
  int32_t ngram_size = 0, heads_per_ngram = 0;
  int32_t eos = 0;
};

// QSA's indexer keys (Flash-Next): block b of a sequence (its tokens [b * ratio, (b + 1) * ratio))
// has the key rope(rms_norm(mean of their raw key rows) * k_norm) at position b * ratio.
struct QsaIndex {
  const Tensor* k_norm = nullptr;  // [head_dim], (1 + w) already added
  const RopeTables* rope = nullptr;
  float eps = 1e-6f;
  int32_t ratio = 0;
};

// Optional per-head RMSNorm of q and k (Qwen3's QK norm), weights [head_dim]; null: none.
struct QkNorm {
  const Tensor* q = nullptr;
  const Tensor* k = nullptr;
  float eps = 1e-6f;
};

// The experts of one MoE layer by address, so a kernel can pick them per token without the host:
// gate_up[e] points at expert e's [2 * inter, hidden] matrix ([gate; up] rows), down[e] at its
// [hidden, inter] matrix, or with down_transposed at its transpose [inter, hidden] (the layout the
// CUDA kernels take: a slice of intermediates is then one contiguous run of bytes); all of
// `dtype`. The address tables are int64 [E] on the experts' device. A zero address is an expert
// held elsewhere (expert parallelism): its (token, slot) pairs add nothing.
struct ExpertTable {
  Tensor gate_up, down;
  DType dtype = DType::kF32;
  int64_t hidden = 0, inter = 0;
  bool down_transposed = false;
};

#if defined(__CUDACC__)
#define RV_HOST_DEVICE __host__ __device__
#else
#define RV_HOST_DEVICE
#endif

// Where fill_uniform's tensor sits in a larger one (whole_cols 0: it is the whole).
struct FillWindow {
  int64_t row0 = 0, col0 = 0, whole_cols = 0;
  // The index in the whole of element i of a tensor `cols` wide.
  RV_HOST_DEVICE int64_t index(int64_t i, int64_t cols) const {
    return whole_cols == 0 ? i : (row0 + i / cols) * whole_cols + col0 + i % cols;
  }
};

// An RMSNorm of an op's output rows into another tensor: normed = rms_norm(out) * weight (f32 [n]).
struct NormInto {
  const Tensor* weight = nullptr;
  float eps = 0.0f;
  Tensor* normed = nullptr;
};

// Gated attention's output gate: columns [column, column + heads * head_dim) of gate [T, >= ...].
struct OutputGate {
  const Tensor* gate = nullptr;
  int64_t column = 0;
};

// The residual add and RMSNorm that follow a block's expert combine, fused into it where a backend
// can (decode-sized batches): residual += y; normed = rms_norm(residual) * weight (f32 [n]).
struct ResidualNorm {
  Tensor* residual = nullptr;
  const Tensor* weight = nullptr;
  float eps = 1e-6f;
  Tensor* normed = nullptr;
};

// A Gated DeltaNet block's weights (see gdn_decode).
struct GdnWeights {
  const Tensor* proj = nullptr;    // [width, hidden] input projection, read when gdn_decode is given x
  const Tensor* conv = nullptr;    // [C, W] depthwise conv over [q | k | v]
  const Tensor* neg_a = nullptr;   // [Hv] -exp(A_log)
  const Tensor* dt_bias = nullptr; // [Hv]
  const Tensor* norm = nullptr;    // [Dv] gated RMSNorm weight
  float norm_eps = 1e-6f;
};

// An RMS norm over groups of x's columns, left to the op that reads x (gdn_decode's gated norm,
// taken by the output projection in a one-token step, so that no block of the decode kernel
// waits for the others to finish its head): columns [g * G, (g + 1) * G) of row t, with
// G = x.size(1) / squares.size(1), are scaled by rsqrt(sum(squares[t, g, :]) / G + eps).
// squares: f32 [T, groups, parts], partial sums of the squares of the group's values.
struct GroupScale {
  const Tensor* squares = nullptr;
  float eps = 1e-6f;
};

// One row of a batched sampling step (the sampler's semantics, see sample/sampler.h): adjustments
// first (min_tokens masks, repetition / presence / frequency penalties, listed per token in
// adjust[adjust_begin, adjust_end)), then temperature, top-k, top-p, min-p and a draw at
// `uniform` of the kept mass. temperature 0 takes the argmax. Logprobs are of the raw logits.
struct SampleRow {
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  float uniform = 0.0f;  // in [0, 1)
  int32_t top_k = 0;
  int32_t num_logprobs = -1;  // -1: none; N: the chosen token's and N top alternatives
  int32_t adjust_begin = 0, adjust_end = 0;
};
struct SampleAdjust {
  int32_t token = 0;
  int32_t masked = 0;     // min_tokens not reached: this EOS / stop token cannot be drawn
  int32_t seen = 0;       // in prompt or output: repetition penalty applies
  int32_t out_count = 0;  // occurrences in the output: presence / frequency penalties apply
  float bias = 0.0f;      // logit_bias: added before the penalties
};
constexpr int kMaxTopLogprobs = 20;
struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

enum class Op {
#define REVOLTA_OP_ENUM(Name, function, ...) k##Name,
  REVOLTA_OPS(REVOLTA_OP_ENUM)
#undef REVOLTA_OP_ENUM
  kCount
};
const char* op_name(Op op);

// What an op would run on, for the backends whose kernels take only some weight formats or
// shapes: the weights' element type and the sizes that constrain kernels (for the MoE ops:
// hidden size and the experts' intermediate size).
struct OpShape {
  DType weight = DType::kF32;
  int64_t rows = 0, cols = 0;
};

// A backend: one function pointer per op (null where the backend lacks it), and which shapes
// its kernels take (null: every op it has takes every shape).
struct OpTable {
#define REVOLTA_OP_POINTER(Name, function, ...) std::add_pointer_t<__VA_ARGS__> function = nullptr;
  REVOLTA_OPS(REVOLTA_OP_POINTER)
#undef REVOLTA_OP_POINTER
  bool (*takes)(Op op, const OpShape& shape) = nullptr;
};

void register_backend(Device device, const OpTable* table);
bool supports_op(Device device, Op op);
// Whether the device's kernel for op takes these weights and sizes: where a model chooses between
// a backend's kernel and another path, it asks here (the backend's policy stays in the backend).
bool supports_op(Device device, Op op, const OpShape& shape);

// The CPU ops run their parallel sections on this pool (per calling thread; null = inline).
void set_cpu_thread_pool(ThreadPool* pool);
ThreadPool* cpu_thread_pool();
// How decode-sized inputs meet quantized blocks in the CPU linear (per calling thread): 16 (the
// default: 8-bit values plus an 8-bit residual, within float32 rounding of the dequantized weights)
// or 8 (llama.cpp's scheme: faster, and near-ties between tokens can flip).
void set_cpu_block_activation_bits(int bits);
int cpu_block_activation_bits();

// ids: int32 [T]; table: [vocab, hidden] any float dtype; out: f32 [T, hidden]. With norm, also
// norm->normed = rms_norm(out) * norm->weight (the first block's input norm, fused where a backend can).
void embedding(const Tensor& ids, const Tensor& table, Tensor& out, const NormInto* norm = nullptr);
// A vocabulary-parallel rank's part of the lookup: table holds rows [first_id, first_id + rows) of
// the vocabulary; out[t] = table[ids[t] - first_id] for ids in that range, zeros elsewhere (the
// ranks' outputs sum to the whole lookup).
void embedding_shard(const Tensor& ids, const Tensor& table, int64_t first_id, Tensor& out);
// Row-wise RMSNorm over the last dimension: out = x / rms(x) * weight. x and out may alias.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// residual += x; out = rms_norm(residual).
void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// out[M, N] = x[M, K] . weight[N, K]^T (+ bias[N]).
void linear(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out);
// out = x' . weight^T, x' = x with its column groups scaled (see GroupScale).
void linear_scaled(const Tensor& x, const GroupScale& scale, const Tensor& weight, Tensor& out);
// In place on x [T, heads, head_dim]: rotate-half RoPE on the first rotary_dim features; positions
// int32 [T], or [T, A] with tables.axes.
void rope(Tensor& x, const Tensor& positions, const RopeTables& tables);
// out[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:].
void silu_mul(const Tensor& gate_up, Tensor& out);
// k, v: [T, kv_heads, head_dim]; caches: [num_blocks, block_size, kv_heads, head_dim];
// slot_mapping: int32 [T] (block * block_size + offset). Caches of float32, float16, E4M3 or int8
// (those two with quant, converted as KvQuant says; every reader of the cache below takes it too).
void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                    Tensor& v_cache, const KvQuant* quant = nullptr);
// q: [T, heads, head_dim]; out: [T, heads, head_dim]. Causal within each sequence; heads map to
// kv heads in groups of heads / kv_heads (GQA). With gate, the output is gated as sigmoid_mul does:
// out[t, j] *= sigmoid(gate[t, column + j]) over the flattened heads (gated attention).
void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate = nullptr,
                     const KvQuant* quant = nullptr);
// out[r, :] = x[rows[r], :]; x, out f32, rows int32 [R] on the same device.
void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out);
// dst[t, :] = src[t, first_column : first_column + dst.cols] (f32; splits fused projections).
void copy_columns(const Tensor& src, int64_t first_column, Tensor& dst);
// out[c, r] = x[r, c]: x [R, C], out [C, R], both of one 2- or 4-byte dtype (weight layouts a
// backend's kernels prefer, made once at load).
void transpose(const Tensor& x, Tensor& out);
// Fills t (f32/f16/bf16) with values uniform in [lo, hi) drawn from a counter-based hash of
// (seed, index): the same values on every device (random weights for benchmarks). With a window,
// t [rows, cols] is that part of a larger tensor of at.whole_cols columns and gets its values
// there (index (at.row0 + r) * at.whole_cols + at.col0 + c): a rank's slice of a made-up weight.
void fill_uniform(Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& at = {});
// out[r] = index of the largest x[r, :] (f32), lowest index on ties; out int32 [R].
void argmax(const Tensor& x, Tensor& out);
// Attention inputs from the fused projection qkv [T, >= (heads + 2 * kv_heads) * head_dim] (columns
// past those, such as an output gate, are left alone): q
// [T, heads, head_dim] normed (optional) and rotated; k normed and rotated and v written to their
// cache slots (kv_cache_write's rules). One pass instead of split + norms + rope + cache write.
void qkv_rope_cache(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                    const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                    const KvQuant* quant = nullptr);
// qkv_rope_cache, then paged_attention over its q (scale, gate as there): one op so that a backend
// can run a decode step's pair as one kernel, which takes this step's k and v from the projection
// instead of the cache it writes them to (q, the cache slots and out end as the pair leaves them,
// except the output of a padding row, slot < 0: no slot is written for it, so it is unspecified).
void qkv_rope_attention(const Tensor& qkv, const QkNorm& norm, const Tensor& positions, const RopeTables& rope,
                        const Tensor& slot_mapping, Tensor& q, Tensor& k_cache, Tensor& v_cache,
                        const AttentionBatch& batch, float scale, Tensor& out, const OutputGate* gate = nullptr,
                        const KvQuant* quant = nullptr);
// act[M, I] = silu(x . W[:I]^T) * (x . W[I:]^T) for the stacked gate_up weight [2I, K]: the MLP's
// first half (decode-sized M: one pass that writes the activation instead of gate_up + silu_mul).
void linear_swiglu(const Tensor& x, const Tensor& gate_up_weight, Tensor& act);
// Gated DeltaNet pieces (per-sequence contracts in ops/cpu/gated_delta_rule.cpp), for a batch of
// sequences: rows [seq_starts[s], seq_starts[s + 1]) belong to sequence s, whose recurrent state
// is slot seq_slots[s] of `states` ([slots, Hv, Dk, Dv] fp32, updated in place) or `conv_states`
// ([slots, C, W - 1]); causal_conv1d's x is [T, X >= C] with the channels in its first
// C = weight.size(0) columns (a fused projection can feed it directly), out [T, C].
// seq_starts / seq_slots are int32 on the op's device; a negative slot marks
// a padding row (no state read or written, zero output). chunk_size <= 1
// selects the recurrent form (backends may pick their form). Also row-wise L2 norm and
// rmsnorm(x) * w * silu(gate).
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& states, const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, int32_t chunk_size);
void causal_conv1d(const Tensor& x, const Tensor& weight, Tensor& conv_states, const Tensor& seq_starts,
                   const Tensor& seq_slots, Tensor& out, bool silu);
constexpr int64_t kCudaConvMaxWidth = 32;  // the widest causal_conv1d kernel the CUDA backend takes
void l2_norm(Tensor& x, int64_t dim, float eps);
// The conv output [T, q | k | v] of a DeltaNet block split into q, k [T, Hk, Dk] (each head
// L2-normalised: x / sqrt(sum x^2 + eps)) and v [T, Hv, Dv].
void gdn_split_qkv(const Tensor& mixed, float eps, Tensor& q, Tensor& k, Tensor& v);
// Gates come from a column window of a wider tensor (a fused projection, no copy): gate is
// [T, G] and the gate of x's element j of token t (x viewed as [T, P]) is gate[t, gate_column + j].
void gated_rms_norm(const Tensor& x, const Tensor& gate, int64_t gate_column, const Tensor& weight, float eps, Tensor& out);
// A DeltaNet block from its fused projection fused [T, >= C + Hv * Dv + 2 * Hv] with columns
// [q | k | v | z | b | a] (C = 2 * Hk * Dk + Hv * Dv) to its normed output out [T, Hv * Dv], for
// decode-sized batches: causal_conv1d (silu) over [q | k | v], q / k heads L2-normalised
// (eps 1e-6), gdn_gates from b and a, the delta rule (recurrent, or one chunk per 64 tokens) on
// `states`, then gated_rms_norm with z. Backends fuse what they can into one pass.
// Given the block's input x [T, hidden], fused is an output: first fused = x . w.proj^T (the
// CUDA backend computes it inside the decode kernel for a step of one token).
// With squares (f32 [T, Hv, ceil(Dv / 32)]), the gated norm's RMS is left to the reader: out is
// the rule's output times w.norm and silu(z), and squares[t, h, p] the sum of the squares of the
// rule's output over columns [32 p, 32 p + 32) of head h (so GroupScale{squares, w.norm_eps}
// finishes the norm).
void gdn_decode(const Tensor* x, Tensor& fused, const GdnWeights& w, Tensor& conv_states, Tensor& states,
                const Tensor& seq_starts, const Tensor& seq_slots, Tensor& out, Tensor* squares = nullptr);
// x *= sigmoid(gate) elementwise (gated attention's output gate), gate as for gated_rms_norm.
void sigmoid_mul(Tensor& x, const Tensor& gate, int64_t gate_column);
// DeltaNet gates from the fused projection [T, width]: with b = columns [first, first + Hv) and
// a = the next Hv columns, beta = sigmoid(b) and g = neg_a * softplus(a + dt_bias), both [T, Hv].
void gdn_gates(const Tensor& fused, int64_t first_column, const Tensor& neg_a, const Tensor& dt_bias, Tensor& beta,
               Tensor& g);
// --- Flash-Next: hyper-connections, n-gram PLE, QSA ---
// out [T, G * group] = each group of x's columns RMS-normalised, times weight [G * group].
void group_rms_norm(const Tensor& x, const Tensor& weight, int64_t group, float eps, Tensor& out);
// out [T, columns] = silu(scale * x[:, :columns]).
void scaled_silu(const Tensor& x, int64_t columns, float scale, Tensor& out);
// Hyper-connection mix: out [T, E] = mean over streams c of sigmoid(mix_logits_c) * normed_c, where
// normed and mix_logits are [T, hc * E] (stream c in columns [c * E, (c + 1) * E)).
void hc_mix(const Tensor& normed, const Tensor& mix_logits, Tensor& out);
// Hyper-connection combine: streams_c += 2 * sigmoid(scale * logits[:, column + c]) * y, streams
// [T, hc * E], y [T, E].
void hc_combine(Tensor& streams, const Tensor& y, const Tensor& logits, int64_t column, float scale);
// out += x (f32, same shape).
void accumulate(Tensor& out, const Tensor& x);
// PLE table rows (int32 [T, heads]) of the batch's tokens (ids int32 [T], sequences by seq_starts /
// seq_slots as for causal_conv1d), as NgramHash says; windows (f32 [slots, ngram_size - 1]) hold each
// slot's previous tokens, newest first, as id + 1 (0: none, read as EOS), and are advanced.
void ngram_rows(const Tensor& ids, const NgramHash& hash, Tensor& windows, const Tensor& seq_starts,
                const Tensor& seq_slots, Tensor& rows);
// PLE's gate: with key, query [T, hc * E] (normalised) and value [T, E], per stream c
// s = key_c . query_c / sqrt(E), out_c = sigmoid(sign(s) sqrt(max(|s|, 1e-6))) * value.
void ple_gate(const Tensor& key, const Tensor& query, const Tensor& value, Tensor& out);
// cache[slot_mapping[t]] = x[t] for rows x f32 [T, W] into a token-row cache f32 [blocks, block_size, W].
void token_rows_write(const Tensor& x, const Tensor& slot_mapping, Tensor& cache);
// QSA's choice: for each query token (position p in its sequence) the top blocks.size(1) of its
// complete blocks ((p + 1) / ratio of them) by score sum over heads of relu(q_h . key_b), q [T, heads,
// D] normalised and roped, key rows the raw indexer keys (token_rows_write), keys as QsaIndex says.
// Ties go to the lower block. blocks int32 [T, top]: the chosen ids in ascending order, -1 past the last.
void qsa_select(const Tensor& q, const Tensor& key_rows, const QsaIndex& index, const AttentionBatch& batch,
                Tensor& blocks);
// paged_attention over the cells QSA keeps: the blocks qsa_select chose and the incomplete tail
// [(p + 1) / ratio * ratio, p] of each query token.
void qsa_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                   const Tensor& blocks, int32_t ratio, float scale, Tensor& out, const OutputGate* gate = nullptr,
                   const KvQuant* quant = nullptr);

// Vision encoders. Row-wise LayerNorm over the last dimension: out = (x - mean) / sqrt(var + eps) *
// weight + bias (f32; x and out may alias).
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps, Tensor& out);
// In place on f32 x: GELU, exact (erf) or its tanh approximation (PyTorch's "gelu_pytorch_tanh").
void gelu(Tensor& x, bool tanh_approximation);
// out[rows[r], :] = src[r, :] (f32; rows int32 [R] on out's device, distinct).
void scatter_rows(Tensor& out, const Tensor& rows, const Tensor& src);
// Bidirectional attention within packed sequences: q, k, v, out f32 [T, heads, head_dim], sequence s
// the rows [seq_starts[s], seq_starts[s + 1]) (int32 [S + 1] on the op's device), no longer than
// max_seq_len; each query row attends to every row of its own sequence.
void varlen_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_starts, int32_t max_seq_len,
                      float scale, Tensor& out);

// DFlash2's grouped dynamic causal conv along each draft block: x, out f32 [R, C] (distinct), C
// channels in G = groups groups of C / G; taps o < K = base.size(0):
//   out[r, c] = sum_o (base[o, c] + dynamic[r, column + o * G + c / (C / G)]) * x[r - o, c],
// where a tap before its block's first row (first_row int32 [R]) reads zero. dynamic f32 [R, >= column + K * G].
void dynamic_conv(const Tensor& x, const Tensor& dynamic, int64_t column, int64_t groups, const Tensor& base,
                  const Tensor& first_row, Tensor& out);

// out[rows[i], :] += weights[i] * y[i, :] (MoE combine; rows int32, weights f32, on out's device).
void scatter_add_rows(Tensor& out, const Tensor& rows, const Tensor& weights, const Tensor& y);
// out[t, :] += sigmoid(gate[t]) * y[t, :] (the shared expert's gate; gate [T, 1]).
void add_gated_rows(Tensor& out, const Tensor& y, const Tensor& gate);
// MoE routing: softmax over the router logits [T, E] (f32, E = num_experts), the K best experts
// per token (ties to the lower id), their probabilities renormalised to sum to one when asked.
// logits may carry one more column, the shared expert's gate logit: then slot K of each token is
// expert E (the shared expert) with weight sigmoid(gate), outside the renormalisation.
// ids int32 [T, K (+ 1)], weights f32 [T, K (+ 1)].
void moe_topk(const Tensor& logits, int64_t num_experts, bool renormalize, Tensor& ids, Tensor& weights);
// The router's logits x . router^T (router f32 [E (+ 1), hidden]) and moe_topk over them in one
// step (a decode batch's routing without a separate top-k launch). With `first`, x is a block's
// output and the routing reads the MoE block's input: first->residual += x and first->normed =
// its RMSNorm (add_rms_norm) come first, and the logits are first->normed . router^T.
void moe_route(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize, Tensor& ids,
               Tensor& weights, const ResidualNorm* first = nullptr);
// The routed experts of a few tokens, without grouping them on the host: out[t] = sum over k of
// weights[t, k] * down_e (silu(gate_e x_t) * up_e x_t), e = ids[t, k]. x, out f32 [T, hidden].
// For decode-sized batches (every (token, expert) pair reads its expert's weights).
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& experts, Tensor& out,
                 const ResidualNorm* then = nullptr);
// A MoE block from its input to its output in one op: moe_route with `first` (x is the previous
// block's output, added to first.residual and normalised into first.normed), then moe_experts on
// first.normed with the ids / weights it chose (and `then`'s residual norm). The CUDA backend
// routes a step of one token inside the experts' kernel, so the experts start without waiting
// for a routing kernel to finish. `warm`: weights the step reads next (the next block's input
// projection), a hint: the CUDA backend pulls part of them into L2 while the routing leaves the
// memory idle; results do not depend on it.
void moe_route_experts(const Tensor& x, const Tensor& router, int64_t num_experts, bool renormalize,
                       const ResidualNorm& first, Tensor& ids, Tensor& weights, const ExpertTable& experts, Tensor& out,
                       const ResidualNorm* then = nullptr, const Tensor* warm = nullptr);
// Samples one token per row of logits [R, vocab] (on any device; results on the host). Kept sets
// are thresholds on the adjusted logits (ties at a top-k / top-p boundary broken by lower index),
// and the draw walks the kept tokens in index order: the same distribution as the host sampler,
// not the same token for the same uniform.
void sample(const Tensor& logits, const std::vector<SampleRow>& rows, const std::vector<SampleAdjust>& adjust,
            std::vector<SampleResult>& out);
// One row's distribution on the host, as `sample` draws from it: at temperature 0 the adjusted
// logits; else the kept tokens' unnormalised probabilities (0: dropped). Speculative verification
// compares a target's rows with a drafter's through it.
std::vector<float> sample_weights(const float* logits, int64_t vocab, const SampleRow& row, const SampleAdjust* adjust);
// The token at `uniform` of the weights' mass, walking the kept tokens in index order.
int32_t draw_index_order(const std::vector<float>& weights, double uniform);


// The value fill_uniform puts at index i: a splitmix64-style hash mapped to [0, 1).
RV_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace revolta::ops
