// Speculative decoding's first role. A Drafter proposes tokens for a request in decode; the
// engine appends them to the request, the scheduling rule computes them with its last token, and
// a Verifier (spec/verifier.h) keeps those the target's rows confirm. Drafters keep their own
// per-request state: a Request carries only how many drafts it holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "sched/request.h"

namespace revolta {

// Proposed tokens. q: where drafts are drawn from a draft model's distribution (draft_sample_method
// probabilistic), each one's distribution, unnormalised as ops::sample_weights gives it; empty for
// point-mass drafts.
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> q;
};

// Where a request's rows lie in a step: its first position, its first row and how many rows.
struct StepRows {
  int32_t start = 0, row = 0, count = 0;
};
using StepRowMap = std::unordered_map<const Request*, StepRows>;

// A step yields at most drafts + 1 tokens: drafts stay within max_tokens and max_model_len.
inline int32_t draft_room(const Request& r, int32_t max_model_len) {
  return std::min(r.params.max_tokens - r.num_output_tokens(), max_model_len - r.num_tokens()) - 1;
}

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to max_tokens drafts for a request whose last token is the next one to compute.
  virtual Draft propose(const Request& r, int32_t max_tokens) = 0;
  // Whether after_step needs the final hidden state of every row (RunnerOptions::hidden).
  virtual bool reads_hidden() const { return false; }
  // After each forward and its verification: the requests still running, where each one's rows
  // lay in the step, and (reads_hidden) the step's final hidden states.
  virtual void after_step(const std::vector<Request*>& running, const StepRowMap& rows, const Tensor& hidden) {
    (void)running, (void)rows, (void)hidden;
  }
};

}  // namespace revolta
