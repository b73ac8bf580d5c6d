// Speculative decoding's pieces: n-gram drafting, and the verification of a one-hot draft, whose
// token distribution must be the target's exactly (integrated over a grid of its two uniforms).
#include <cmath>
#include <vector>

#include "expect.h"
#include "spec/ngram_drafter.h"
#include "spec/rejection.h"

using namespace revolta;

namespace {

// The token distribution verify_draft gives over a midpoint grid of its two uniforms, which
// integrates it exactly up to the grid's resolution.
std::vector<double> verdict_distribution(const std::vector<float>& w, int32_t draft) {
  const int n = 400;
  std::vector<double> out(w.size(), 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const DraftVerdict v = verify_draft(w, draft, (i + 0.5) / n, (j + 0.5) / n);
      out[size_t(v.token)] += 1.0 / (double(n) * n);
    }
  return out;
}

void test_rejection_keeps_the_target() {
  const std::vector<float> w = {0.0f, 3.0f, 1.0f, 0.5f, 0.0f, 2.5f};  // unnormalised; 0: dropped
  double total = 0.0;
  for (float x : w) total += x;
  for (int32_t draft : {1, 3, 4, 5}) {  // likely, unlikely, dropped (never accepted), likely
    const std::vector<double> got = verdict_distribution(w, draft);
    for (size_t t = 0; t < w.size(); ++t) EXPECT(std::fabs(got[t] - double(w[t]) / total) < 3e-3);
  }
  const DraftVerdict sure = verify_draft({0.0f, 1.0f, 0.0f}, 1, 0.999, 0.5);  // p(draft) = 1
  EXPECT(sure.accepted && sure.token == 1);
  EXPECT(propose_ngram({1, 2, 3, 9, 1, 2, 3}, 1, 3, 2) == (std::vector<int32_t>{9, 1}));  // the 3-gram's follow-up
  EXPECT(propose_ngram({4, 5, 6, 7}, 1, 3, 2).empty());                                 // nothing recurs
  EXPECT(propose_ngram({7, 1, 7, 2, 7}, 1, 2, 3) == (std::vector<int32_t>{2, 7}));      // the latest match
}

}  // namespace

void run_speculative_tests() { test_rejection_keeps_the_target(); }
