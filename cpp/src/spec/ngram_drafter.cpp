#include "spec/ngram_drafter.h"

#include <algorithm>

namespace revolta {

std::vector<int32_t> propose_ngram(const std::vector<int32_t>& tokens, int32_t min_n, int32_t max_n, int32_t k) {
  const int64_t L = int64_t(tokens.size());
  for (int64_t n = std::min<int64_t>(max_n, L - 1); n >= min_n; --n) {
    const int32_t* suffix = tokens.data() + (L - n);
    // The latest earlier occurrence: its start i < L - n, so something follows it.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int64_t from = i + n, to = std::min(L, from + k);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

}  // namespace revolta
