// Ranks 1..N-1 of a tensor-parallel engine: threads of this process, each bound to its device (GPU
// r for CUDA ranks, whose collectives go over NCCL; host memory for CPU ranks, over a LocalGroup)
// with its shard of the model, a KV cache of the same blocks holding its own KV heads, a runner
// and a share of the CPU threads; the engine thread is rank 0 and the one scheduler's block tables
// serve every rank. A step hands the scheduler's output to every worker and runs rank 0's forward
// beside them; the collectives inside the forward keep the ranks in step. Only rank 0's logits are
// sampled (every rank computes the same ones).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache_coordinator.h"
#include "cache/kv_tiers.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"
#include "model/model.h"
#include "runtime/model_runner.h"

namespace revolta {

class TensorParallelRanks {
 public:
  using Loader = std::function<std::unique_ptr<CausalLM>(Communicator*)>;
  // Starts ranks 1..world-1 on `device`, each loading its shard (load(its communicator)) on its own
  // thread; rank 0 loads its own with rank0().
  // block_activation_bits: the workers' ops::set_cpu_block_activation_bits.
  TensorParallelRanks(int world, Device device, const Loader& load, int threads_per_rank,
                     int block_activation_bits = 16);
  ~TensorParallelRanks();
  Communicator* rank0() { return comms_[0].get(); }
  int64_t worker_weight_bytes() const;
  // Each worker's caches of `plan` (rank 0's, once final), with rank 0's KV scales, and runner.
  void make_runners(const CachePlan& plan, const CacheLimits& limits, const RunnerOptions& ropts,
                    const std::vector<std::pair<float, float>>& kv_scales);
  // Sleep mode: every worker frees its runner and caches (with models, its model too) and gives its
  // device's cached blocks back.
  void drop(bool models);
  // Rank 0's forward (`run`) with every worker's forward of the same step beside it (its state
  // `actions` first: the step's and the snapshots rank 0 took since the last one). A failing rank
  // aborts the group, so the others' collectives fail instead of waiting; the first error is
  // rethrown here, and the group stays unusable (the engine treats it as fatal).
  // fed: the workers feed the greedy ids of their own last logits (async scheduling's step queued
  // before rank 0's tokens were read; keep_greedy_ids has them computed after every step).
  StepLogits execute(const SchedulerOutput& step, const std::vector<StateAction>& actions,
                     const std::function<StepLogits()>& run, bool fed = false);
  void keep_greedy_ids(bool keep) { keep_ids_ = keep; }
  // KV offload copies on every rank (each its shard of the entries), rank 0's by `rank0`; the
  // workers apply `snapshots` (rank 0's since the last step) first. Returns every rank's pending
  // saves (revolta::run_transfers), rank order.
  std::vector<std::unique_ptr<PendingCopy>> run_transfers(
      const std::vector<BlockTransfer>& transfers, const std::vector<StateAction>& snapshots,
      const std::function<std::unique_ptr<PendingCopy>()>& rank0);
  // `fn` on every rank's model at once (their forwards run the collectives together), rank 0's on
  // this thread.
  void on_models(const std::function<void(CausalLM&, int rank)>& fn, CausalLM& rank0);
  // Every rank records its decode graphs at once (their sizing runs execute the collectives).
  void capture_graphs(const std::function<void()>& rank0);
  // A speculative step's parts on every worker beside rank 0's (engine_spec.cpp). draft_forward:
  // each worker runs the MTP layer on the rows `rows` of its own hidden states, those of its last
  // forward (from_step) or of its last draft_forward. roll_back: state restores, then replays.
  ForwardOutput draft_forward(const std::vector<DraftSpan>& spans, const std::vector<int32_t>& rows, bool from_step,
                              int32_t layer, const std::function<ForwardOutput()>& rank0);
  void roll_back(const std::vector<StateAction>& restores, const std::vector<StateReplay>& replays,
                 const std::function<void()>& rank0);

 private:
  struct Worker;
  // `job` on every worker's thread and `rank0` on this one, together. A failure aborts the group;
  // fatal: thrown as a DeviceError (execute's), else as the failing rank threw it (startup).
  void run_all(const std::function<void(Worker&)>& job, const std::function<void()>& rank0, bool fatal = false);
  void abort_all(const std::string& reason);
  void work(Worker& w);
  void stop();  // ends and joins the workers' threads
  Device device_;
  int block_activation_bits_;
  bool keep_ids_ = false;
  std::unique_ptr<LocalGroup> local_;  // CPU ranks' transport
  std::vector<std::unique_ptr<Communicator>> comms_;  // by rank
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(Worker&)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::string error_;
  std::exception_ptr first_;  // the first failure as thrown
};

}  // namespace revolta
