#include "model/decoder_common.h"

#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

int64_t EmbeddingAndHead::nbytes() const {
  return int64_t(embed.nbytes()) + (lm_head.data() == embed.data() ? 0 : int64_t(lm_head.nbytes()));
}

EmbeddingAndHead load_embedding_and_head(const WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                         DType dt) {
  EmbeddingAndHead e;
  e.embed = w.get(prefix + "embed_tokens.weight", {c.vocab_size, c.hidden_size}, dt);
  if (c.tie_word_embeddings || !w.has("lm_head.weight")) {
    RV_CHECK(c.tie_word_embeddings, "model ", w.dir(), ": missing tensor 'lm_head.weight'");
    e.lm_head = e.embed;
  } else {
    e.lm_head = w.get("lm_head.weight", {c.vocab_size, c.hidden_size}, dt);
  }
  return e;
}

Tensor final_logits(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& lm_head) {
  const int64_t H = x.size(1), R = int64_t(rows.size());
  Tensor picked = Tensor::empty({R, H}, DType::kF32);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(picked.ptr<float>() + r * H, x.ptr<float>() + int64_t(rows[size_t(r)]) * H, size_t(H) * 4);
  Tensor logits = Tensor::empty({R, lm_head.size(0)}, DType::kF32);
  ops::linear(picked, lm_head, nullptr, logits);
  return logits;
}

}  // namespace revolta
