// Speculative decoding's pieces: n-gram drafting, and the verification of a draft sampled from a
// drafter's distribution q, whose token distribution must be the target's exactly (integrated
// over the draft and a grid of the two uniforms). Verification of point-mass drafts is tested end
// to end (greedy output unchanged, and a chi-square test of sampled output, tests/test_speculative.py).
#include <cmath>
#include <vector>

#include "expect.h"
#include "spec/ngram_drafter.h"
#include "spec/sampled_drafts.h"

using namespace revolta;

namespace {

void test_ngram_drafts() {
  EXPECT(propose_ngram({1, 2, 3, 9, 1, 2, 3}, 1, 3, 2) == (std::vector<int32_t>{9, 1}));  // the 3-gram's follow-up
  EXPECT(propose_ngram({4, 5, 6, 7}, 1, 3, 2).empty());                                 // nothing recurs
  EXPECT(propose_ngram({7, 1, 7, 2, 7}, 1, 2, 3) == (std::vector<int32_t>{2, 7}));      // the latest match
}

// The verdict's token distribution with the draft drawn from q and a midpoint grid of the two
// uniforms, which integrates it exactly up to the grid's resolution.
std::vector<double> verdict_distribution(const std::vector<float>& p, const std::vector<float>& q) {
  const int n = 300;
  double sq = 0.0;
  for (float x : q) sq += x;
  std::vector<double> out(p.size(), 0.0);
  for (size_t d = 0; d < q.size(); ++d) {
    if (q[d] <= 0.0f) continue;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const DraftVerdict v = verify_sampled_draft(p, q, int32_t(d), (i + 0.5) / n, (j + 0.5) / n);
        out[size_t(v.token)] += double(q[d]) / sq / (double(n) * n);
      }
  }
  return out;
}

void test_sampled_drafts_keep_the_target() {
  const std::vector<float> p = {0.0f, 3.0f, 1.0f, 0.5f, 0.0f, 2.5f};  // unnormalised; 0: dropped
  for (const std::vector<float>& q : {std::vector<float>{1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f},   // flat
                                      std::vector<float>{0.0f, 0.5f, 4.0f, 0.0f, 2.0f, 0.1f},   // unlike p
                                      p}) {                                                     // p itself
    double total = 0.0;
    for (float x : p) total += x;
    const std::vector<double> got = verdict_distribution(p, q);
    for (size_t t = 0; t < p.size(); ++t) EXPECT(std::fabs(got[t] - double(p[t]) / total) < 3e-3);
  }
  const DraftVerdict same = verify_sampled_draft(p, p, 1, 0.999, 0.5);  // q = p: always kept
  EXPECT(same.accepted && same.token == 1);
}

}  // namespace

void run_speculative_tests() {
  test_ngram_drafts();
  test_sampled_drafts_keep_the_target();
}
