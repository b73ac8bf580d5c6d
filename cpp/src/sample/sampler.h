// Token sampling for one request row of logits: logprobs of the raw distribution, then
// min_tokens masking, penalties, temperature, top-k, top-p, min-p and a seeded draw.
#pragma once

#include <cstdint>
#include <vector>

#include "revolta/engine.h"
#include "sample/rng.h"

namespace revolta {

struct SamplingContext {
  const SamplingParams* params;
  const std::vector<int32_t>* tokens;  // prompt + output so far
  int32_t num_prompt_tokens;
  const std::vector<int32_t>* eos_token_ids;
  Rng* rng;
};

// logits: one row of vocab floats (not modified).
TokenOutput sample_token(const float* logits, int32_t vocab, const SamplingContext& ctx);

}  // namespace revolta
