#include "engine/serving.h"

#include "engine/kv_offload.h"

namespace revolta {

Serving::Serving(const ServingSpec& spec, CausalLM& model, TensorParallelRanks* tp) {
  const EngineConfig& cfg = *spec.cfg;
  caches = std::make_unique<CacheCoordinator>(*spec.plan, *spec.limits, spec.device);
  layers_without_kv_scales = set_kv_scales(*spec.kv_scales, caches->kv());
  tiers = make_kv_tiers(cfg, spec.kv_fingerprint, spec.world, caches->kv(), caches->states());
  caches->manager().set_tiers(tiers.get());
  scheduler = std::make_unique<Scheduler>(SchedulerConfig{cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
                                                          parse_scheduling_policy(cfg.scheduling_policy)},
                                          caches->manager());
  if (tp) tp->make_runners(*spec.plan, *spec.limits, *spec.runner, *spec.kv_scales);
  runner = std::make_unique<ModelRunner>(model, caches->kv(), caches->states(), *spec.runner);
  // Recorded now rather than when a size first comes: no step waits for a recording, and their
  // memory is taken before serving starts (the plan counted it in the activations).
  if (tp) tp->capture_graphs([&] { runner->capture_graphs(); });
  else runner->capture_graphs();
}

void Serving::count(EngineStats& s, const EngineStats& d) const {
  const KvCacheManager& m = caches->manager();
  s.num_running = scheduler->num_running();
  s.num_waiting = scheduler->num_waiting();
  s.num_blocks_free = m.pool().num_free();
  s.num_blocks_used = s.num_blocks_total - s.num_blocks_free;
  s.prefix_cache_queries = d.prefix_cache_queries + m.queries();
  s.prefix_cache_hits = d.prefix_cache_hits + m.hits();
  s.kv_offload_hit_tokens = d.kv_offload_hit_tokens + m.tier_hits();
  s.num_preemptions = d.num_preemptions + scheduler->num_preemptions();
  s.graph_replays = d.graph_replays + runner->graph_replays();
  s.kv_offload_host_bytes = 0;
  if (!tiers) return;
  const KvTierStats t = tiers->stats();
  s.kv_offload_host_hits = d.kv_offload_host_hits + t.host_hits;
  s.kv_offload_disk_hits = d.kv_offload_disk_hits + t.disk_hits;
  s.kv_offload_bytes_offloaded = d.kv_offload_bytes_offloaded + t.bytes_offloaded;
  s.kv_offload_bytes_restored = d.kv_offload_bytes_restored + t.bytes_restored;
  s.kv_offload_host_bytes = t.host_bytes;
  s.kv_offload_disk_bytes = t.disk.bytes;
  s.kv_offload_disk_bytes_written = d.kv_offload_disk_bytes_written + t.disk.bytes_written;
  s.kv_offload_disk_bytes_read = d.kv_offload_disk_bytes_read + t.disk.bytes_read;
  s.kv_offload_disk_rejected = d.kv_offload_disk_rejected + t.disk.rejected;
  s.kv_offload_disk_write_skips = d.kv_offload_disk_write_skips + t.disk.write_skips;
}

}  // namespace revolta
