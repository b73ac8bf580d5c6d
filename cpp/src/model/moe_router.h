// Mixture-of-experts routing: softmax over the router logits (float32), the top-k experts per
// token (ties go to the lower expert id), optionally renormalised to sum to one.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace revolta {

// logits: [tokens, experts]. Returns, per expert, the (token, weight) pairs routed to it, in
// token order: experts are then computed as one batched GEMM each.
std::vector<std::vector<std::pair<int64_t, float>>> route_tokens(const float* logits, int64_t tokens,
                                                                 int64_t experts, int64_t top_k, bool renormalize);
// The same grouping from a routing already made (ops::moe_topk's ids and weights, [tokens, top_k]).
std::vector<std::vector<std::pair<int64_t, float>>> group_by_expert(const int32_t* ids, const float* weights,
                                                                    int64_t tokens, int64_t experts, int64_t top_k);

}  // namespace revolta
