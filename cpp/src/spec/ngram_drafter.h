// Prompt-lookup drafting (vLLM's "ngram" method): no weights, any architecture. The request's
// last n tokens, for n from max_n down to min_n, are looked up earlier in its own tokens; the
// tokens that followed the latest earlier match are the drafts. Quoting, editing and extracting
// prompts make the output repeat its input, which this guesses for free.
#pragma once

#include <cstdint>
#include <vector>

#include "spec/drafter.h"

namespace revolta {

// Up to k drafts for the sequence `tokens` (none when no n-gram recurs).
std::vector<int32_t> propose_ngram(const std::vector<int32_t>& tokens, int32_t min_n, int32_t max_n, int32_t k);

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {}
  Draft propose(const Request& r, int32_t max_tokens) override {
    return {propose_ngram(r.tokens, min_n_, max_n_, max_tokens), {}};
  }

 private:
  int32_t min_n_, max_n_;
};

}  // namespace revolta
