// Ranks 1..N-1 of a tensor-parallel engine: threads of this process, each with its shard of the
// model, a KV cache of the same blocks holding its own KV heads, a runner and a share of the CPU
// threads; the engine thread is rank 0 and the one scheduler's block tables serve every rank.
// A step hands the scheduler's output to every worker and runs rank 0's forward beside them; the
// collectives inside the forward keep the ranks in step. Only rank 0's logits are sampled (the
// LM head is replicated, so every rank computes the same ones).
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache_coordinator.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"
#include "model/model.h"
#include "runtime/model_runner.h"

namespace revolta {

class TensorParallelRanks {
 public:
  using Loader = std::function<std::unique_ptr<CausalLM>(Communicator*)>;
  // Loads ranks 1..world-1 (load(their communicator)) with caches of `plan`.
  TensorParallelRanks(int world, const Loader& load, const CachePlan& plan, const CacheLimits& limits,
                      const RunnerOptions& ropts, int threads_per_rank);
  ~TensorParallelRanks();
  Communicator* rank0() { return rank0_.get(); }
  int64_t worker_weight_bytes() const;
  // Rank 0's forward (`run`) with every worker's forward of the same step beside it (its state
  // `actions` first: the step's and the snapshots rank 0 took since the last one). A failing rank
  // aborts the group, so the others' collectives throw instead of waiting; the first error is
  // rethrown here, and the group stays unusable (the engine treats it as fatal).
  StepLogits execute(const SchedulerOutput& step, const std::vector<StateAction>& actions,
                     const std::function<StepLogits()>& run);

 private:
  struct Worker;
  void work(Worker& w);
  LocalGroup group_;
  std::unique_ptr<Communicator> rank0_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const SchedulerOutput* step_ = nullptr;
  const std::vector<StateAction>* actions_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::string error_;
};

}  // namespace revolta
