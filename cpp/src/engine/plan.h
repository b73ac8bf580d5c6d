// What an engine will be, decided from its options and the model's config before any weight is
// read: a pure function, so every choice (weight and KV element types, the cache split, the memory
// budget, speculation, runner options, graph sizes) is testable without a model or a device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache/cache_coordinator.h"
#include "model/model.h"
#include "revolta/engine.h"
#include "runtime/model_runner.h"

namespace revolta {

// The device's memory as measured before loading (CUDA with gpu_memory_utilization; else unused).
struct DeviceMemory {
  int64_t total = 0;
  int64_t free = 0;
};

struct EnginePlan {
  EngineConfig cfg;   // max_model_len resolved
  ModelConfig model;  // quantization as asked (load_format dummy), max_positions set
  Device device = Device::kCPU;
  std::string weight_dtype;  // float32 | float16 | bfloat16
  int world = 1;             // tensor-parallel ranks
  bool expert_parallel = false;
  int threads = 1;           // of every rank together
  bool speculative = false, mtp = false;
  bool async_scheduling = false;
  CacheSpecs groups;         // the model's declaration, KV element type chosen
  CacheLimits limits;
  CachePlan caches;          // split of the budget below (its bytes fixed; by_utilization: shrunk after loading)
  bool by_utilization = false;
  int64_t activation_bytes = 0;  // estimated (by_utilization)
  RunnerOptions runner;
  std::string quantization;      // ModelInfo::quantization
};

// Throws std::invalid_argument naming the option when the options, the model and the device do
// not fit together. hardware_threads: what num_threads 0 means.
EnginePlan plan_engine(const EngineConfig& cfg, const ModelConfig& model, const DeviceMemory& memory,
                       int hardware_threads);

// Decode batch sizes recorded as graphs: vLLM's list (1, 2, 4, multiples of 8 to 256, of 16 to 512)
// and max_num_seqs, or cuda_graph_batch_sizes; none above max_num_seqs, no repeats.
std::vector<int32_t> graph_batch_sizes(const EngineConfig& cfg);

// The budget for the caches once the weights are in: what gpu_memory_utilization leaves of the
// measured device memory after the activations.
int64_t cache_budget_after_load(const EnginePlan& plan, const DeviceMemory& measured);

}  // namespace revolta
