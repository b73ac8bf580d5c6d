// Verification of a draft sampled from a draft model's distribution q (draft_sample_method
// "probabilistic"), as speculative sampling does it (Leviathan et al. 2023; Chen et al. 2023):
// the draft d is kept with probability min(1, p(d) / q(d)); otherwise the token is drawn from the
// residual max(0, p - q), renormalised. Either way the token follows the target p exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace revolta {

struct DraftVerdict {
  bool accepted = false;
  int32_t token = -1;  // the draft, or the residual draw that replaces it
};

// p and q: the target's and the drafter's unnormalised probabilities over the vocabulary
// (ops::sample_weights); q(draft) > 0. u_accept and u_residual: uniforms in [0, 1).
DraftVerdict verify_sampled_draft(const std::vector<float>& p, const std::vector<float>& q, int32_t draft,
                                  double u_accept, double u_residual);

}  // namespace revolta
