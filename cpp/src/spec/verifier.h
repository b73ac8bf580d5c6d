// Speculative decoding's second role: after a forward, row j of a drafted request is the target's
// distribution after its draft j - 1. Greedy requests keep drafts while they equal the row's
// (adjusted) argmax; sampled ones draw every row as without speculation and keep drafts while they
// equal the draws, which is rejection sampling of a point-mass draft exactly, so the output follows
// the target. Drafts drawn from a draft distribution q are kept with probability min(1, p / q),
// else replaced from the residual (spec/sampled_drafts.h). The first row that differs gives the
// next token; all kept, the last row gives one more.
#pragma once

#include <unordered_map>
#include <vector>

#include "runtime/model_runner.h"
#include "spec/drafter.h"

namespace revolta {

// What one sampler of a step yields. Undrafted: its row's sample, accepted 0. Drafted: the token of
// every row up to the first that rejects its draft (all k + 1 when the rule compares whole rows),
// and how many drafts were kept.
struct Verdict {
  std::vector<TokenOutput> tokens;
  int32_t accepted = 0;
  int32_t drafts = 0;
};

class Verifier {
 public:
  // keep_every_sampled_draft: a wrong rule that keeps every draft of a sampled request (fault
  // injection, for the test that must catch it).
  Verifier(const std::vector<int32_t>& eos_token_ids, bool keep_every_sampled_draft)
      : eos_(eos_token_ids), keep_every_sampled_(keep_every_sampled_draft) {}
  // One verdict per sampler of the step, in order. q_of: the draft distributions of requests whose
  // drafts were drawn from one, by request id. Every row is sampled through the op table.
  std::vector<Verdict> verify(const StepLogits& step, const std::unordered_map<uint64_t, std::vector<std::vector<float>>>& q_of);

 private:
  Verdict verify_drawn_drafts(Request& r, const Tensor& logits, int32_t first_row, const std::vector<std::vector<float>>& q);
  std::vector<int32_t> eos_;
  bool keep_every_sampled_;
};

}  // namespace revolta
