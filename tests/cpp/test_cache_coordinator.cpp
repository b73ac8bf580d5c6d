// The cache coordinator: one budget split between the model's cache groups (state slots first,
// blocks from the rest), the state actions it hands the runner (zero a new request's slot,
// restore a prefix hit's snapshot) and the snapshots it takes after a forward.
#include <functional>
#include <stdexcept>
#include <string>

#include "cache/cache_coordinator.h"
#include "expect.h"

using namespace revolta;

namespace {

StateSpec tiny_state() {
  StateSpec s;
  s.num_layers = 1;
  s.conv_dim = 4;
  s.conv_history = 3;
  s.num_heads = 1;
  s.k_dim = 2;
  s.v_dim = 2;
  return s;  // (4 * 3 + 1 * 2 * 2) * 4 = 64 bytes a slot
}

bool throws_naming(const std::string& option, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find(option) != std::string::npos;
  }
  return false;
}

void test_budget_split() {
  const CacheSpecs groups = {CacheGroupSpec::paged_kv({2, 1, 4, DType::kF32}),  // 64 bytes a token
                             CacheGroupSpec::recurrent_state(tiny_state())};
  const CacheLimits limits{4, 3, 16, true};  // 4-token blocks, 3 sequences, 16 tokens
  const CachePlan shape = plan_shape(groups, limits);
  EXPECT(shape.state_slots == 3 && shape.snapshot_slots == 3 && shape.state_bytes == 6 * 64);
  EXPECT(shape.block_bytes == 256 && shape.need_blocks == 4 && shape.min_bytes() == 6 * 64 + 4 * 256);
  const CachePlan plan = plan_caches(groups, limits, 6 * 64 + 10 * 256 + 100, "kv_cache_memory_bytes");
  EXPECT(plan.num_blocks == 10);  // what the states leave, in whole blocks
  EXPECT(throws_naming("kv_cache_memory_bytes", [&] { plan_caches(groups, limits, shape.min_bytes() - 1, "kv_cache_memory_bytes"); }));
  EXPECT(throws_naming("my_budget", [&] { plan_caches(groups, limits, 6 * 64, "my_budget"); }));  // not even the states
  CachePlan shrunk = plan;
  shrunk.shrink_to(6 * 64 + 5 * 256);
  EXPECT(shrunk.num_blocks == 5);
  shrunk.shrink_to(0);
  EXPECT(shrunk.num_blocks == 4);  // never below one request of max_model_len
  const CachePlan no_prefix = plan_shape(groups, {4, 3, 16, false});
  EXPECT(no_prefix.snapshot_slots == 0 && no_prefix.state_bytes == 3 * 64);
  const CacheSpecs two_kv = {groups[0], groups[0]};
  EXPECT(throws_naming("paged-KV", [&] { plan_shape(two_kv, limits); }));
}

void test_state_actions_and_snapshots() {
  const CacheSpecs groups = {CacheGroupSpec::paged_kv({1, 1, 4, DType::kF32}), CacheGroupSpec::recurrent_state(tiny_state())};
  const CacheLimits limits{4, 2, 32, true};
  CacheCoordinator c(plan_caches(groups, limits, 1 << 20, "kv_cache_memory_bytes"), limits, Device::kCPU);
  Request r;
  r.id = 1;
  for (int32_t t = 0; t < 9; ++t) r.tokens.push_back(100 + t);
  r.num_prompt_tokens = 9;  // snapshot boundary 8
  EXPECT(c.manager().allocate_slots(r, 8));
  std::vector<StateAction> a = c.prepare({{&r, 8}});
  EXPECT(a.size() == 1 && a[0].from == -1 && a[0].to == r.state_slot);  // a new request's slot is zeroed
  EXPECT(c.prepare({{&r, 8}}).empty());                                  // once
  c.states()->ssm[0].ptr<float>()[r.state_slot * 4] = 7.0f;  // the state the forward left
  r.num_computed_tokens = 8;
  c.commit(r);  // on the boundary: blocks registered, state snapshotted
  Request same;
  same.id = 2;
  same.tokens = r.tokens;
  same.num_prompt_tokens = 9;
  EXPECT(c.manager().match_prefix(same) == 8 && same.state_restore >= 0);
  const int32_t snapshot = same.state_restore;
  EXPECT(c.manager().allocate_slots(same, 1));
  a = c.prepare({{&same, 1}});
  EXPECT(a.size() == 1 && a[0].from == snapshot && a[0].to == same.state_slot);  // the hit restores, not zeroes
  c.states()->apply(a);
  EXPECT(c.states()->ssm[0].ptr<float>()[same.state_slot * 4] == 7.0f);  // restored from the snapshot
  c.manager().free(r);
  c.manager().free(same);
}

}  // namespace

void run_cache_coordinator_tests() {
  test_budget_split();
  test_state_actions_and_snapshots();
}
