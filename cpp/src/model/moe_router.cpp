#include "model/moe_router.h"

#include "ops/ops.h"

namespace revolta {

std::vector<std::vector<std::pair<int64_t, float>>> group_by_expert(const int32_t* ids, const float* weights,
                                                                    int64_t T, int64_t E, int64_t K) {
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) routed[size_t(ids[t * K + k])].push_back({t, weights[t * K + k]});
  return routed;
}

std::vector<std::vector<std::pair<int64_t, float>>> route_tokens(const float* logits, int64_t T, int64_t E,
                                                                 int64_t K, bool renormalize) {
  const Tensor l = Tensor::wrap(const_cast<float*>(logits), {T, E}, DType::kF32, nullptr);
  Tensor ids = Tensor::uninitialized({T, K}, DType::kI32), w = Tensor::uninitialized({T, K}, DType::kF32);
  ops::moe_topk(l, E, renormalize, ids, w);
  return group_by_expert(ids.ptr<int32_t>(), w.ptr<float>(), T, E, K);
}

}  // namespace revolta
