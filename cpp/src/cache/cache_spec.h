// What a model's layers need cached, as data (vLLM's KVCacheSpec): a list of groups, each a set
// of layers with one spec. The model declares them (model/: cache_specs_for, CausalLM::cache_specs);
// cache/ sizes, allocates and hands them out without knowing the architecture.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/state_cache.h"

namespace revolta {

struct CacheGroupSpec {
  enum class Kind { kPagedKv, kRecurrentState, kTokenRows };
  Kind kind = Kind::kPagedKv;
  KvCacheSpec kv;      // kPagedKv: layers, kv heads, head dim, element type, per token
  StateSpec state;     // kRecurrentState: layers and shapes of the conv and delta-rule states, per slot
  int32_t slots_per_request = 1;  // kRecurrentState: slots a running request holds
  TokenRowsSpec rows;  // kTokenRows: per-token rows paged with the K/V (their block tables)

  static CacheGroupSpec paged_kv(const KvCacheSpec& kv) { return {Kind::kPagedKv, kv, {}, 0, {}}; }
  static CacheGroupSpec recurrent_state(const StateSpec& s) { return {Kind::kRecurrentState, {}, s, 1, {}}; }
  static CacheGroupSpec token_rows(const TokenRowsSpec& r) { return {Kind::kTokenRows, {}, {}, 0, r}; }
};

using CacheSpecs = std::vector<CacheGroupSpec>;

}  // namespace revolta
