#include "spec/rejection.h"

#include "ops/cpu/cpu_ops.h"

namespace revolta {

DraftVerdict verify_draft(const std::vector<float>& weights, int32_t draft, double u_accept, double u_residual) {
  double total = 0.0;
  for (float w : weights) total += w;
  const double p_draft = draft >= 0 && size_t(draft) < weights.size() ? double(weights[size_t(draft)]) / total : 0.0;
  if (u_accept < p_draft) return {true, draft};
  std::vector<float> residual = weights;
  if (draft >= 0 && size_t(draft) < residual.size()) residual[size_t(draft)] = 0.0f;
  return {false, ops::cpu::draw_index_order(residual, u_residual)};
}

}  // namespace revolta
