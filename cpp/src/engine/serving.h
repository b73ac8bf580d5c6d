// What serving requests needs beyond the weights: the caches of every group, the offload tiers
// below them, the scheduler over the caches' blocks and the runner with its recorded graphs. They
// are built together and freed together: sleep frees the whole, wake_up builds it again.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache_coordinator.h"
#include "cache/kv_tiers.h"
#include "engine/tensor_parallel.h"
#include "model/model.h"
#include "revolta/engine.h"
#include "runtime/model_runner.h"
#include "sched/scheduler.h"

namespace revolta {

struct ServingSpec {
  const EngineConfig* cfg = nullptr;
  const CachePlan* plan = nullptr;
  const CacheLimits* limits = nullptr;
  const RunnerOptions* runner = nullptr;
  const std::vector<std::pair<float, float>>* kv_scales = nullptr;
  uint64_t kv_fingerprint = 0;  // names the offload tiers' entries (engine/kv_offload.h)
  Device device = Device::kCPU;
  int world = 1;
};

struct Serving {
  // The model's (rank 0) and the other ranks' (tp) serving parts.
  Serving(const ServingSpec& spec, CausalLM& model, TensorParallelRanks* tp);
  Serving(const Serving&) = delete;
  Serving& operator=(const Serving&) = delete;

  // Declared in the order they depend on one another: destroyed in reverse, tiers last.
  std::unique_ptr<KvTiers> tiers;  // null: no offload
  std::unique_ptr<CacheCoordinator> caches;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;
  int32_t layers_without_kv_scales = 0;

  // The counters of these parts since they were built, each added to `before` (what parts
  // freed by sleep had counted), and their gauges, into `s`.
  void count(EngineStats& s, const EngineStats& before) const;
};

}  // namespace revolta
