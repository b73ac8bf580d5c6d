// Unit tests of the block pool, the cache manager, the scheduler and the sampling forms (run by
// tests/test_cpp.py).
// Prints "N passed, M failed" and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <set>

#include "cache/block_pool.h"
#include "cache/cache_manager.h"
#include "model/moe_router.h"
#include "sched/scheduler.h"
#include "expect.h"

using namespace revolta;

int g_passed = 0, g_failed = 0;
void run_sampling_tests();     // test_sampling.cpp
void run_memory_plan_tests();  // test_memory_plan.cpp
void run_weight_layout_tests();  // test_weight_layout.cpp
void run_async_scheduling_tests();  // test_async_scheduling.cpp
void run_cache_coordinator_tests();  // test_cache_coordinator.cpp
void run_runner_rows_tests();  // test_runner_rows.cpp
void run_tensor_parallel_tests();  // test_tensor_parallel.cpp
void run_speculative_tests();  // test_speculative.cpp
void run_communicator_tests();  // test_communicator.cpp
void run_kv_tier_tests();  // test_kv_tiers.cpp
void run_scheduling_policy_tests();  // test_scheduling_policy.cpp
void run_engine_plan_tests();  // test_engine_plan.cpp

static std::unique_ptr<Request> make_request(uint64_t id, int n_tokens, int first = 100) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->tokens.resize(size_t(n_tokens));
  std::iota(r->tokens.begin(), r->tokens.end(), first);
  r->num_prompt_tokens = n_tokens;
  return r;
}

static void test_pool_lru_and_prefix() {
  BlockPool pool(4, 2, true);
  auto a = pool.allocate(3);
  EXPECT(a && a->size() == 3 && pool.num_free() == 1);
  EXPECT(!pool.allocate(2));  // all-or-nothing
  EXPECT(pool.num_free() == 1);
  int32_t toks[2] = {7, 8};
  uint64_t h = BlockPool::hash_block(0, toks, 2);
  pool.register_block((*a)[0], h, 0, toks);
  EXPECT(pool.lookup(h, 0, toks) == (*a)[0]);
  int32_t other[2] = {7, 9};
  EXPECT(pool.lookup(h, 0, other) == -1);  // tokens are compared, not only hashes
  EXPECT(pool.lookup(h, 1, toks) == -1);   // so is the parent
  pool.release({(*a)[2], (*a)[1], (*a)[0]});
  EXPECT(pool.num_free() == 4);
  // The cached block is free but still found; acquiring revives it.
  EXPECT(pool.lookup(h, 0, toks) == (*a)[0]);
  pool.acquire((*a)[0]);
  EXPECT(pool.num_free() == 3);
  pool.release({(*a)[0]});
  // LRU: the block never allocated comes first, then the released ones in release order.
  auto b = pool.allocate(4);
  EXPECT(b && (*b)[1] == (*a)[2] && (*b)[2] == (*a)[1] && (*b)[3] == (*a)[0]);
  EXPECT(pool.lookup(h, 0, toks) == -1);  // reusing a block evicts its hash
}

static void test_prefix_match_leaves_one_token() {
  KvCacheManager kv(16, 4, true);
  auto r1 = make_request(1, 8);
  EXPECT(kv.match_prefix(*r1) == 0);
  EXPECT(kv.allocate_slots(*r1, 8));
  r1->num_computed_tokens = 8;
  kv.cache_full_blocks(*r1);
  auto r2 = make_request(2, 8);  // same 8 tokens: 2 full blocks cached, only 1 may be used
  EXPECT(kv.match_prefix(*r2) == 4);
  EXPECT(r2->num_computed_tokens == 4 && r2->block_table.size() == 1);
  EXPECT(r2->block_table[0] == r1->block_table[0]);  // shared block
  auto r3 = make_request(3, 9);  // 9 tokens: both full blocks hit
  EXPECT(kv.match_prefix(*r3) == 8);
  EXPECT(kv.hits() == 12 && kv.queries() == 25);
  kv.free(*r1);
  kv.free(*r2);
  kv.free(*r3);
  EXPECT(kv.pool().num_free() == 16);
}

static void test_budget_and_seq_limit() {
  KvCacheManager kv(64, 4, false);
  Scheduler s({/*max_num_seqs=*/2, /*max_num_batched_tokens=*/10, /*max_model_len=*/64}, kv);
  s.add(make_request(1, 7));
  s.add(make_request(2, 7));
  s.add(make_request(3, 7));
  auto out = s.schedule();
  EXPECT(out.num_batched_tokens == 10);  // 7 + a chunk of 3
  EXPECT(out.scheduled.size() == 2 && out.scheduled[1].num_new_tokens == 3);
  EXPECT(s.num_running() == 2 && s.num_waiting() == 1);  // max_num_seqs
  for (auto& sr : out.scheduled) sr.request->num_computed_tokens += sr.num_new_tokens;
  out = s.schedule();  // request 2 finishes its prefill (4 tokens); request 1 has nothing left
  EXPECT(out.num_batched_tokens == 4 && out.scheduled.size() == 1);
}

static void test_preemption_recomputes_later() {
  KvCacheManager kv(4, 4, false);  // 16 token slots
  Scheduler s({4, 64, 64}, kv);
  s.add(make_request(1, 8));
  s.add(make_request(2, 8));
  auto out = s.schedule();
  EXPECT(out.scheduled.size() == 2 && kv.pool().num_free() == 0);
  for (auto& sr : out.scheduled) sr.request->num_computed_tokens += sr.num_new_tokens;
  // Both generate a token: request 1 needs a fifth block, so request 2 is preempted.
  for (auto& sr : out.scheduled) sr.request->tokens.push_back(1);
  out = s.schedule();
  EXPECT(s.num_preemptions() == 1);
  EXPECT(out.scheduled.size() == 1 && out.scheduled[0].request->id == 1);
  EXPECT(s.num_waiting() == 1 && s.num_running() == 1);
  auto removed = s.remove(1);
  EXPECT(removed && kv.pool().num_free() == 4);
  out = s.schedule();  // request 2 comes back and recomputes all 9 tokens
  EXPECT(out.scheduled.size() == 1 && out.scheduled[0].request->id == 2 &&
         out.scheduled[0].num_new_tokens == 9);
}

static void test_router_ties_and_renormalization() {
  // token 0: all four experts tie; token 1: expert 2 best, experts 0 and 3 tie for second place
  const float logits[8] = {0.f, 0.f, 0.f, 0.f, 1.f, -1.f, 3.f, 1.f};
  auto r = route_tokens(logits, 2, 4, 2, true);
  EXPECT(r[0].size() == 2 && r[0][0].first == 0 && r[0][1].first == 1);  // ties: lower ids
  EXPECT(r[1].size() == 1 && r[1][0].first == 0);
  EXPECT(r[2].size() == 1 && r[2][0].first == 1 && r[3].empty());
  EXPECT(std::abs(r[0][0].second - 0.5f) < 1e-6f);                         // renormalised
  float e3 = std::exp(3.f), e1 = std::exp(1.f);
  EXPECT(std::abs(r[2][0].second - e3 / (e3 + e1)) < 1e-6f);
  auto raw = route_tokens(logits, 2, 4, 2, false);                          // plain softmax weights
  EXPECT(std::abs(raw[0][0].second - 0.25f) < 1e-6f);
}

static void test_hybrid_snapshots_superseded_and_hits() {
  // 2 state slots + 2 snapshot slots (ids 2 and 3); 4-token blocks.
  KvCacheManager kv(32, 4, true, 2, 2);
  auto r = make_request(1, 15);  // snapshot boundary: (15 - 1) / 4 * 4 = 12
  EXPECT(kv.snapshot_boundary(*r) == 12);
  EXPECT(kv.allocate_slots(*r, 15) && r->state_slot >= 0 && r->state_fresh);
  int32_t saved = -1;
  for (int32_t done : {4, 8, 12}) {  // the prefill advances block by block
    r->num_computed_tokens = done;
    kv.cache_full_blocks(*r);
    int32_t slot = kv.snapshot_target(*r);
    EXPECT(slot == 2 || slot == 3);
    EXPECT(kv.num_snapshots() == 1);  // the superseded, shorter snapshot was freed
    saved = slot;
  }
  r->num_computed_tokens = 15;
  kv.cache_full_blocks(*r);
  EXPECT(kv.snapshot_target(*r) == -1);  // past the boundary: no more snapshots
  auto same = make_request(2, 15);
  EXPECT(kv.match_prefix(*same) == 12 && same->state_restore == saved);
  auto shorter = make_request(3, 6);  // shares only the first block, whose snapshot was superseded
  EXPECT(kv.match_prefix(*shorter) == 0 && shorter->block_table.empty() && shorter->state_restore == -1);
  kv.free(*r);
  kv.free(*same);
  EXPECT(kv.pool().num_free() == 32);
}

int main() {
  test_hybrid_snapshots_superseded_and_hits();
  test_router_ties_and_renormalization();
  test_pool_lru_and_prefix();
  test_prefix_match_leaves_one_token();
  test_budget_and_seq_limit();
  test_preemption_recomputes_later();
  run_sampling_tests();
  run_memory_plan_tests();
  run_weight_layout_tests();
  run_async_scheduling_tests();
  run_cache_coordinator_tests();
  run_runner_rows_tests();
  run_tensor_parallel_tests();
  run_speculative_tests();
  run_communicator_tests();
  run_kv_tier_tests();
  run_scheduling_policy_tests();
  run_engine_plan_tests();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
