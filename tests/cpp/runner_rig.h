// A model (made-up weights, CPU) with its caches, scheduler and runner, as the engine wires them,
// for the tests that drive steps by hand: 4 sequences, blocks of 4, a 64-token context.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/cache_coordinator.h"
#include "model/model.h"
#include "runtime/model_runner.h"

namespace revolta {

struct RunnerRig {
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<CacheCoordinator> caches;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ModelRunner> runner;
};

// Requests 1, 2, ... with these prompts, waiting in the scheduler.
inline void add_prompts(Scheduler& scheduler, const std::vector<std::vector<int32_t>>& prompts) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = std::make_unique<Request>();
    r->id = i + 1;
    r->tokens = prompts[i];
    r->num_prompt_tokens = int32_t(prompts[i].size());
    scheduler.add(std::move(r));
  }
}

// tp: the rank's tensor-parallel group (null: unsharded); expert_parallel: whole experts per rank.
inline RunnerRig make_runner_rig(const std::string& dir, const ModelConfig& c, HiddenRows hidden,
                                 Communicator* tp = nullptr, bool expert_parallel = false) {
  RunnerRig g;
  g.model = load_model(dir, c, DType::kF32, Device::kCPU, /*dummy=*/true, /*gguf=*/false, tp, expert_parallel);
  const CacheLimits limits{4, 4, 64, false};
  CacheSpecs specs = g.model->cache_specs();  // MTP layers keep K/V after the model's, as the engine plans them
  for (CacheGroupSpec& s : specs)
    if (s.kind == CacheGroupSpec::Kind::kPagedKv) s.kv.num_layers += g.model->num_mtp_layers();
  g.caches = std::make_unique<CacheCoordinator>(plan_caches(specs, limits, 4 << 20, "budget"), limits, Device::kCPU);
  g.scheduler = std::make_unique<Scheduler>(SchedulerConfig{4, 256, 64}, g.caches->manager());
  RunnerOptions o;
  o.max_model_len = 64;
  o.hidden = hidden;
  g.runner = std::make_unique<ModelRunner>(*g.model, g.caches->kv(), g.caches->states(), o);
  return g;
}

}  // namespace revolta
