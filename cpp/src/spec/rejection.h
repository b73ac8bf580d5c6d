// Verification of a draft proposed with certainty (an n-gram draft: the draft distribution is
// one-hot), as standard speculative sampling does it (Leviathan et al. 2023): the draft is kept
// with probability p(draft); otherwise the token is drawn from p with the draft taken out and
// renormalised. Either way the token follows the target distribution p exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace revolta {

struct DraftVerdict {
  bool accepted = false;
  int32_t token = -1;  // the draft, or the residual draw that replaces it
};

// weights: the target's unnormalised probabilities (ops::cpu::sample_weights); u_accept and
// u_residual: uniforms in [0, 1) from the request's generator.
DraftVerdict verify_draft(const std::vector<float>& weights, int32_t draft, double u_accept, double u_residual);

}  // namespace revolta
