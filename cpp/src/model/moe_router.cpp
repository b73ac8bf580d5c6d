#include "model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace revolta {

std::vector<std::vector<std::pair<int64_t, float>>> route_tokens(const float* logits, int64_t T, int64_t E,
                                                                 int64_t K, bool renormalize) {
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
    for (auto& v : p) v /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t a, int64_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    float top = 0.0f;
    for (int64_t i = 0; i < K; ++i) top += p[size_t(idx[size_t(i)])];
    for (int64_t i = 0; i < K; ++i) {
      const int64_t e = idx[size_t(i)];
      routed[size_t(e)].push_back({t, renormalize ? p[size_t(e)] / top : p[size_t(e)]});
    }
  }
  return routed;
}

}  // namespace revolta
