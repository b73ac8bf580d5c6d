#include "engine/memory_plan.h"

#include <algorithm>

namespace revolta {

int64_t estimate_weight_bytes(const ModelConfig& c, size_t bpe) {
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t qkvo = H * D * (2 * int64_t(c.num_heads) + 2 * int64_t(c.num_kv_heads));
  const int64_t per_layer = (qkvo + 3 * H * I) * int64_t(bpe) + 2 * H * 4;
  const int64_t embed = int64_t(c.vocab_size) * H * int64_t(bpe);
  return int64_t(c.num_layers) * per_layer + embed * (c.tie_word_embeddings ? 1 : 2) + H * 4;
}

int64_t estimate_activation_bytes(const ModelConfig& c, const EngineConfig& e) {
  const int64_t T = e.max_num_batched_tokens, H = c.hidden_size, D = c.head_dim;
  const int64_t QO = int64_t(c.num_heads) * D, KVO = int64_t(c.num_kv_heads) * D;
  const int64_t per_token = 4 * H + 2 * (QO + 2 * KVO) + 2 * QO + 3 * int64_t(c.intermediate_size);
  const int64_t logits = int64_t(std::max(e.max_num_seqs, 32)) * c.vocab_size * 2;
  return 2 * (T * per_token + logits) * 4 + (int64_t(256) << 20);
}

}  // namespace revolta
