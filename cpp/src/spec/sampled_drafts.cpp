#include "spec/sampled_drafts.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

DraftVerdict verify_sampled_draft(const std::vector<float>& p, const std::vector<float>& q, int32_t draft,
                                  double u_accept, double u_residual) {
  RV_CHECK(p.size() == q.size() && draft >= 0 && size_t(draft) < p.size(), "verify_sampled_draft: bad sizes");
  double sp = 0.0, sq = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sp += p[i], sq += q[i];
  const double pd = double(p[size_t(draft)]) / sp, qd = double(q[size_t(draft)]) / sq;
  RV_CHECK(qd > 0.0, "verify_sampled_draft: the draft has no probability under its own distribution");
  if (u_accept * qd < pd) return {true, draft};
  // The residual max(0, p - q) over normalised p and q; it is not all zero once a draft can be
  // rejected (p != q).
  std::vector<float> residual(p.size());
  double mass = 0.0;
  for (size_t i = 0; i < p.size(); ++i) mass += residual[i] = float(std::max(0.0, double(p[i]) / sp - double(q[i]) / sq));
  if (!(mass > 0.0)) return {true, draft};  // p and q equal up to rounding
  return {false, ops::draw_index_order(residual, u_residual)};
}

}  // namespace revolta
