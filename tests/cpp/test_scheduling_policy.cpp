// The order the scheduling policies admit and preempt requests in (sched/scheduler.h states the rule).
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/cache_manager.h"
#include "sched/scheduler.h"
#include "expect.h"

using namespace revolta;

namespace {

std::unique_ptr<Request> tagged(uint64_t id, int n_tokens, uint64_t group, uint64_t client = 0, int32_t priority = 0) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->tokens.resize(size_t(n_tokens));
  std::iota(r->tokens.begin(), r->tokens.end(), 100 + int32_t(id) * 50);
  r->num_prompt_tokens = n_tokens;
  r->tag = SchedulingTag{priority, group, client};
  return r;
}

// Runs a step and marks its tokens computed; returns the ids it admitted (new to running).
std::vector<uint64_t> step(Scheduler& s) {
  std::vector<uint64_t> before;
  for (Request* r : s.running()) before.push_back(r->id);
  SchedulerOutput out = s.schedule();
  for (auto& sr : out.scheduled) sr.request->num_computed_tokens += sr.num_new_tokens;
  std::vector<uint64_t> admitted;
  for (Request* r : s.running())
    if (std::find(before.begin(), before.end(), r->id) == before.end()) admitted.push_back(r->id);
  return admitted;
}

std::vector<uint64_t> running_ids(const Scheduler& s) {
  std::vector<uint64_t> ids;
  for (Request* r : s.running()) ids.push_back(r->id);
  return ids;
}

using Ids = std::vector<uint64_t>;

void test_fair_admits_round_robin_across_requests() {
  // One request's fan-out (group 1: ids 1-6) arrives first, then two small requests; three slots,
  // and one frees at a time.
  for (SchedulingPolicy policy : {SchedulingPolicy::kFair, SchedulingPolicy::kFcfs}) {
    KvCacheManager kv(64, 4, false);
    Scheduler s({3, 256, 64, policy}, kv);
    for (uint64_t id = 1; id <= 6; ++id) s.add(tagged(id, 4, /*group=*/1));
    s.add(tagged(7, 4, 2));
    s.add(tagged(8, 4, 2));
    s.add(tagged(9, 4, 3));
    Ids order = step(s);
    const Ids first = order;
    for (uint64_t done : first) {
      s.remove(done);
      Ids more = step(s);
      order.insert(order.end(), more.begin(), more.end());
    }
    if (policy == SchedulingPolicy::kFair) {
      EXPECT((order == Ids{1, 7, 9, 2, 8, 3}));  // the group with the fewest running first, then arrival
    } else {
      EXPECT((order == Ids{1, 2, 3, 4, 5, 6}));  // the small requests wait behind the whole fan-out
    }
  }
}

void test_fair_shares_clients_before_requests() {
  KvCacheManager kv(64, 4, false);
  Scheduler s({4, 256, 64, SchedulingPolicy::kFair}, kv);
  for (uint64_t id = 1; id <= 3; ++id) s.add(tagged(id, 4, /*group=*/1, /*client=*/10));
  for (uint64_t id = 4; id <= 6; ++id) s.add(tagged(id, 4, 2, 10));
  for (uint64_t id = 7; id <= 8; ++id) s.add(tagged(id, 4, 3, 20));
  // client 10 (first), client 20, then client 10's other request, then client 20 again
  EXPECT((step(s) == Ids{1, 7, 4, 8}));
}

void test_priority_orders_by_priority_then_arrival() {
  KvCacheManager kv(64, 4, false);
  Scheduler s({4, 256, 64, SchedulingPolicy::kPriority}, kv);
  const int32_t priorities[] = {5, 1, 3, 1, -2};
  for (uint64_t id = 1; id <= 5; ++id) s.add(tagged(id, 4, id, 0, priorities[id - 1]));
  auto waiting = s.waiting_by_priority();
  EXPECT(waiting.size() == 4 && waiting[0] == std::make_pair(-2, int64_t(1)) && waiting[1] == std::make_pair(1, int64_t(2)));
  EXPECT((step(s) == Ids{5, 2, 4, 3}));
  EXPECT(s.waiting_by_priority() == (std::vector<std::pair<int32_t, int64_t>>{{5, 1}}));
}

void test_displacement() {
  // fair: a request arriving while one request's fan-out fills every slot takes one of them;
  // fcfs waits; and the swap never reverses (3 running vs 1 is left alone).
  for (SchedulingPolicy policy : {SchedulingPolicy::kFair, SchedulingPolicy::kFcfs}) {
    KvCacheManager kv(64, 4, false);
    Scheduler s({4, 256, 64, policy}, kv);
    for (uint64_t id = 1; id <= 5; ++id) s.add(tagged(id, 4, 1));
    step(s);
    s.add(tagged(9, 4, 2));
    Ids admitted = step(s);
    if (policy == SchedulingPolicy::kFair) {
      EXPECT((admitted == Ids{9}) && s.num_preemptions() == 1);
      EXPECT((running_ids(s) == Ids{1, 2, 3, 9}));  // the fan-out's last admitted gave way
      s.add(tagged(10, 4, 3));                       // group 1 runs 3, group 3 none: a swap
      EXPECT((step(s) == Ids{10}) && s.num_preemptions() == 2);
      s.add(tagged(11, 4, 2));                       // group 1 runs 2, group 2 one: no swap
      EXPECT(step(s).empty() && s.num_preemptions() == 2);
    } else {
      EXPECT(admitted.empty() && s.num_preemptions() == 0);
    }
  }
  // priority: only a strictly lower value displaces, and the victim is the worst, last admitted.
  KvCacheManager kv(64, 4, false);
  Scheduler s({2, 256, 64, SchedulingPolicy::kPriority}, kv);
  s.add(tagged(1, 4, 1, 0, 3));
  s.add(tagged(2, 4, 2, 0, 0));
  step(s);
  s.add(tagged(3, 4, 3, 0, 3));
  EXPECT(step(s).empty());  // equal to the worst running: waits
  s.add(tagged(4, 4, 4, 0, -1));
  EXPECT((step(s) == Ids{4}) && (running_ids(s) == Ids{2, 4}) && s.num_preemptions() == 1);
}

void test_block_shortage_victims() {
  // Group 1's three requests run, then group 2's; blocks run out when request 1 needs a new one.
  for (SchedulingPolicy policy : {SchedulingPolicy::kFair, SchedulingPolicy::kFcfs}) {
    KvCacheManager kv(8, 4, false);
    Scheduler s({8, 256, 64, policy}, kv);
    for (uint64_t id = 1; id <= 3; ++id) s.add(tagged(id, 8, 1));
    step(s);
    s.add(tagged(4, 8, 2));
    step(s);
    EXPECT(kv.pool().num_free() == 0);
    s.running()[0]->tokens.push_back(1);  // request 1's next token needs a third block
    s.schedule();
    EXPECT(s.num_preemptions() == 1);
    // fcfs gives up the last admitted (group 2's only request); fair the most-served group's last.
    const uint64_t victim = policy == SchedulingPolicy::kFair ? 3 : 4;
    Ids running = running_ids(s);
    EXPECT(std::find(running.begin(), running.end(), victim) == running.end() && running.size() == 3);
  }
  // A victim scheduled earlier in the step gives its tokens back, and the request after it is
  // still scheduled: [1, 2] of group 1 fit their next token, group 2's request needs a block.
  KvCacheManager kv(6, 4, false);
  Scheduler s({8, 256, 64, SchedulingPolicy::kFair}, kv);
  s.add(tagged(1, 7, 1));
  s.add(tagged(2, 7, 1));
  step(s);
  s.add(tagged(3, 8, 2));
  step(s);
  for (Request* r : s.running()) r->tokens.push_back(1);
  SchedulerOutput out = s.schedule();
  EXPECT(out.scheduled.size() == 2 && out.scheduled[0].request->id == 1 && out.scheduled[1].request->id == 3);
  EXPECT(out.num_batched_tokens == 2 && s.num_waiting() == 1 && s.num_preemptions() == 1);
}

}  // namespace

void run_scheduling_policy_tests() {
  test_fair_admits_round_robin_across_requests();
  test_fair_shares_clients_before_requests();
  test_priority_orders_by_priority_then_arrival();
  test_displacement();
  test_block_shortage_victims();
  EXPECT(throws_naming([] { parse_scheduling_policy("lifo"); }, "scheduling_policy"));
}
