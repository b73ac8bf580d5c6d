// E4M3 KV-cache scales measured rather than read from the checkpoint (calculate_kv_scales).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "cache/cache_spec.h"
#include "model/model.h"

namespace revolta {

// A pass of `prompts` (token ids, each cut to max_model_len - 1) through the model, one at a time,
// with a cache of `groups` in the device's float type (float32 on the CPU, float16 on CUDA); per
// attention cache layer, twice the largest |K| and |V| it wrote over 448 (E4M3's largest value):
// values up to twice those seen keep their precision. {1, 1} for a layer the pass leaves empty
// (the MTP layers, which a plain forward does not run).
std::vector<std::pair<float, float>> calibrate_kv_scales(CausalLM& model, CacheSpecs groups,
                                                          const std::vector<std::vector<int32_t>>& prompts,
                                                          int32_t block_size, int32_t max_model_len);

}  // namespace revolta
