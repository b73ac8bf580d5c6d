// The engine thread's counters (`live`) published for other threads: those the serving parts keep
// are read from them, carried on across sleep from what the freed parts had counted (`dropped`).
#include <map>

#include "engine/engine_impl.h"

namespace revolta {

void Engine::Impl::publish_stats() {
  std::map<int32_t, int64_t> by_priority;
  if (serving) {
    serving->count(live, dropped);
    for (auto [priority, n] : serving->scheduler->waiting_by_priority()) by_priority[priority] += n;
  } else {  // asleep: every request is parked, no block exists
    live.num_running = 0;
    live.num_waiting = int64_t(parked.size());
    live.num_blocks_free = live.num_blocks_used = 0;
    live.kv_offload_host_bytes = 0;
    for (const auto& r : parked) ++by_priority[r->tag.priority];
  }
  if (encoder_cache) {
    live.mm_encoder_cache_hits = encoder_cache->hits();
    live.mm_encoder_cache_bytes = encoder_cache->bytes();
  }
  std::lock_guard<std::mutex> lk(stats_mu);
  stats = live;
  {
    std::lock_guard<std::mutex> in_lk(in_mu);
    stats.num_waiting += int64_t(inbox.size());
    for (const auto& r : inbox) ++by_priority[r->tag.priority];
  }
  stats.waiting_by_priority.assign(by_priority.begin(), by_priority.end());
}

}  // namespace revolta
