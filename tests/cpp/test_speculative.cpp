// Speculative decoding's n-gram drafting (verification is tested end to end: greedy output
// unchanged, and a chi-square test of sampled output, in tests/test_speculative.py).
#include <vector>

#include "expect.h"
#include "spec/ngram_drafter.h"

using namespace revolta;

namespace {

void test_ngram_drafts() {
  EXPECT(propose_ngram({1, 2, 3, 9, 1, 2, 3}, 1, 3, 2) == (std::vector<int32_t>{9, 1}));  // the 3-gram's follow-up
  EXPECT(propose_ngram({4, 5, 6, 7}, 1, 3, 2).empty());                                 // nothing recurs
  EXPECT(propose_ngram({7, 1, 7, 2, 7}, 1, 2, 3) == (std::vector<int32_t>{2, 7}));      // the latest match
}

}  // namespace

void run_speculative_tests() { test_ngram_drafts(); }
