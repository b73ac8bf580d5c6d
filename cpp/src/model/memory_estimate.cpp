#include "model/memory_estimate.h"

#include <algorithm>

#include "quant/formats.h"

namespace revolta {

namespace {

// Flash-Next's additions on the device: two hyper-connection mixers a layer and the last one, the
// QSA indexers, PLE's key and value projections (its table stays in host memory).
int64_t flash_next_bytes(const ModelConfig& c, int64_t b) {
  const FlashNextConfig& f = c.flash;
  if (f.hc_count == 0) return 0;
  const int64_t hcE = int64_t(f.hc_count) * c.hidden_size, r = f.hc_lowrank;
  const int64_t mixer = (2 * r + f.hc_count) * hcE * b + hcE * 4;
  int64_t n = (2 * int64_t(c.num_layers) + 1) * mixer;
  if (f.indexer_ratio > 0)
    n += int64_t(c.num_attention_layers()) * (int64_t(f.indexer_heads + 1) * f.indexer_head_dim * c.hidden_size * b);
  n += int64_t(f.ple_layers.size()) * (hcE + c.hidden_size) * f.ple_embed_dim * b;
  return n;
}

}  // namespace

int64_t estimate_weight_bytes(const ModelConfig& c, size_t bpe) {
  const int64_t H = c.hidden_size, D = c.head_dim, b = int64_t(bpe);
  // Quantized linear layers (the embedding and head stay) in their format's bytes.
  const WeightFormat* format = c.quantization.method.empty() ? nullptr : &weight_format(c.quantization.method, "quantization");
  const auto linear = [&](int64_t values) { return format ? format->bytes(values, c.quantization.group_size) : values * b; };
  // Qwen3-Next and Qwen3.5 attention projects a gate beside q.
  const bool gated = c.architecture.rfind("Qwen3Next", 0) == 0 || c.architecture.rfind("Qwen3_5", 0) == 0 ||
                     c.flash.hc_count > 0;
  // The hybrid decoder (MoE or DeltaNet layers) keeps its input projections, DeltaNet's output and
  // the MTP fc in 16 bits (the fused decode kernels read them); the dense decoder quantizes them all.
  const bool hybrid = c.num_experts > 0 || c.num_linear_layers() > 0;
  const auto projection = [&](int64_t values) { return hybrid ? values * b : linear(values); };
  const int64_t attn_in = H * D * (int64_t(c.num_heads) * (gated ? 2 : 1) + 2 * int64_t(c.num_kv_heads));
  const int64_t attn = projection(attn_in) + linear(H * D * int64_t(c.num_heads));
  const int64_t key_dim = int64_t(c.linear_num_key_heads) * c.linear_key_head_dim;
  const int64_t value_dim = int64_t(c.linear_num_value_heads) * c.linear_value_head_dim;
  const int64_t gdn = (2 * key_dim + 2 * value_dim + 2 * int64_t(c.linear_num_value_heads)) * H + H * value_dim;
  // The feed-forward block: experts (+ router rows and a shared expert), or a dense MLP.
  const auto ffn = [&](bool moe) {
    if (!moe) return linear(3 * int64_t(c.intermediate_size) * H);
    int64_t n = linear(int64_t(c.num_experts) * 3 * c.moe_intermediate_size * H) + int64_t(c.num_experts) * H * 4;
    if (c.shared_expert_intermediate_size > 0) n += linear(3 * int64_t(c.shared_expert_intermediate_size) * H) + H * 4;
    return n;
  };
  int64_t total = 0;
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const bool is_linear = !c.linear_layers.empty() && c.linear_layers[size_t(l)];
    total += (is_linear ? projection(gdn) : attn) + 2 * H * 4 + ffn(c.num_experts > 0 && c.is_moe_layer(l));  // + the two norms (f32)
  }
  // An MTP layer: a full-attention decoder layer with the model's MoE, the fc joining embedding
  // and hidden state (2H -> H) and three norms.
  total += c.num_mtp_layers * (attn + projection(2 * H * H) + 5 * H * 4 + ffn(c.num_experts > 0));
  total += flash_next_bytes(c, b);
  const int64_t embed = int64_t(c.vocab_size) * H * b;
  return total + embed * (c.tie_word_embeddings ? 1 : 2) + H * 4;
}

int64_t estimate_activation_bytes(const ModelConfig& c, const EngineConfig& e) {
  const int64_t T = e.max_num_batched_tokens, H = c.hidden_size, D = c.head_dim;
  const int64_t QO = int64_t(c.num_heads) * D, KVO = int64_t(c.num_kv_heads) * D;
  const int64_t per_token = 4 * H + 2 * (QO + 2 * KVO) + 2 * QO + 3 * int64_t(c.intermediate_size);
  const int64_t logits = int64_t(std::max(e.max_num_seqs, 32)) * c.vocab_size * 2;
  // 4-bit linear layers of a prefill run on a float16 copy of the widest one, 4-bit experts on float16
  // copies of a layer's experts (and the shared one beside them).
  const bool quantized = c.quantization.group_size > 0;
  const int64_t widest = 2 * H * std::max({int64_t(2) * c.intermediate_size, QO + 2 * KVO, int64_t(H)});
  const int64_t experts = (int64_t(c.num_experts) + 1) * 3 * c.moe_intermediate_size * H * 2;
  const int64_t dequantized = quantized ? std::max(widest, c.num_experts > 0 ? experts : 0) : 0;
  // Flash-Next: the residual streams and, at the PLE layer, their key / query / gated / conv companions
  // with the gathered rows, all float32 over hc x H; QSA's kept blocks and a probability per kept
  // cell and head a query, and the indexer's score per block of the context.
  const FlashNextConfig& f = c.flash;
  const int64_t hcH = int64_t(f.hc_count) * H, r = std::max(f.indexer_ratio, 1);
  const int64_t qsa = f.indexer_ratio > 0 ? f.top_blocks() + int64_t(c.num_heads) * (f.top_blocks() + 1) * r +
                                                int64_t(e.max_model_len) / r
                                          : 0;
  const int64_t flash = f.hc_count > 0 ? T * ((6 * hcH + f.ple_embed_dim + H) + qsa) * 4 : 0;
  return 2 * (T * per_token + logits) * 4 + flash + dequantized + (int64_t(256) << 20);
}

}  // namespace revolta
