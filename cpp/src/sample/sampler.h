// The engine's one sampling semantics, on every device. Each request's row of logits gets its
// adjustments listed from the request's tokens (min_tokens masks of EOS / stop tokens,
// repetition / presence / frequency penalties), then ops::sample applies temperature, top-k,
// top-p and min-p and draws at the request's next uniform (one per non-greedy sample, from its
// seeded Rng). The CPU implementation of ops::sample is the reference of the CUDA kernel, so a
// seeded request draws the same tokens on both devices where their logits agree.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "sample/grammar.h"
#include "revolta/engine.h"
#include "sample/rng.h"

namespace revolta {

struct SamplingContext {
  const SamplingParams* params;
  const std::vector<int32_t>* tokens;  // prompt + output so far
  int32_t num_prompt_tokens;
  const std::vector<int32_t>* eos_token_ids;
  Rng* rng;
  // The first `history` tokens are the row's history (a speculative row sees the drafts before
  // it, not those after); kAllTokens: all of them.
  size_t history = kAllTokens;
  static constexpr size_t kAllTokens = ~size_t(0);
  GrammarMatcher* grammar = nullptr;  // guided decoding: only the tokens it allows may be drawn
};

// logits: [rows, vocab] on any device; one token per row (with logprobs, and the raw row when
// return_generation_logits asks for it).
std::vector<TokenOutput> sample_rows(const Tensor& logits, const std::vector<SamplingContext>& rows);

// The ops::sample row of a request whose history is its first `history` tokens (a speculative
// row sees the drafts before it), its adjustments appended to `adjust`; no uniform drawn.
// allowed (guided decoding: GrammarMatcher::allowed's bits): the other tokens are masked.
ops::SampleRow sample_row(const SamplingContext& c, size_t history, int32_t vocab, std::vector<ops::SampleAdjust>& adjust,
                          const std::vector<uint32_t>* allowed = nullptr);

}  // namespace revolta
