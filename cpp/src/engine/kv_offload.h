// The engine's side of the KV offload tiers (cache/kv_tiers.h): what identifies the cache's bytes
// (the fingerprint every disk file carries), and the tiers an EngineConfig asks for.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "cache/kv_tiers.h"
#include "model/model_config.h"
#include "revolta/engine.h"

namespace revolta {

// A hash of what makes two engines' KV blocks interchangeable: the model (its config and weight
// files: names, sizes and a sample of their last bytes), weight and cache element types, the KV
// scales, block size and the rank layout. A block written under another fingerprint is never
// read as this engine's.
uint64_t kv_fingerprint(const EngineConfig& cfg, const ModelConfig& model, const std::string& weight_dtype,
                        const std::string& kv_dtype, const std::vector<std::pair<float, float>>& kv_scales);

// Null when the config asks for no tier. world: tensor-parallel ranks, whose shards of a block
// (their rank-0-sized shares) an entry holds side by side.
std::unique_ptr<KvTiers> make_kv_tiers(const EngineConfig& cfg, uint64_t fingerprint, int world, const KvCache& kv,
                                       const StateCache* states);

}  // namespace revolta
