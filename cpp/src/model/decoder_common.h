// Pieces every decoder architecture shares: the token embedding with its (possibly tied) output
// head, and the final projection of the rows that sample.
#pragma once

#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"

namespace revolta {

struct EmbeddingAndHead {
  Tensor embed, lm_head;  // lm_head shares embed's memory when the embeddings are tied
  int64_t nbytes() const;
};

// Loads `<prefix>embed_tokens.weight` and `lm_head.weight` (or ties them); names the missing one.
EmbeddingAndHead load_embedding_and_head(const WeightLoader& w, const std::string& prefix, const ModelConfig& c,
                                         DType dt);

// f32 logits [rows.size(), vocab] of the given rows of the final hidden states x [T, hidden].
Tensor final_logits(const Tensor& x, const std::vector<int32_t>& rows, const Tensor& lm_head);

}  // namespace revolta
