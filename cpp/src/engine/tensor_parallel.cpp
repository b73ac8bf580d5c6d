#include "engine/tensor_parallel.h"

#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

struct TensorParallelRanks::Worker {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<CacheCoordinator> caches;  // only its storage is used: the blocks are rank 0's
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<ThreadPool> pool;
  uint64_t seen = 0;
  std::thread thread;
};

TensorParallelRanks::TensorParallelRanks(int world, const Loader& load, const CachePlan& plan,
                                         const CacheLimits& limits, const RunnerOptions& ropts, int threads_per_rank)
    : group_(world), rank0_(group_.communicator(0)) {
  for (int r = 1; r < world; ++r) {
    auto w = std::make_unique<Worker>();
    w->comm = group_.communicator(r);
    w->model = load(w->comm.get());
    w->caches = std::make_unique<CacheCoordinator>(plan, limits, w->model->device());
    w->runner = std::make_unique<ModelRunner>(*w->model, w->caches->kv(), w->caches->states(), ropts);
    w->pool = std::make_unique<ThreadPool>(std::max(1, threads_per_rank));
    workers_.push_back(std::move(w));
  }
  for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { work(*p); });
}

TensorParallelRanks::~TensorParallelRanks() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w->thread.join();
}

int64_t TensorParallelRanks::worker_weight_bytes() const {
  int64_t n = 0;
  for (const auto& w : workers_) n += w->model->weight_bytes();
  return n;
}

void TensorParallelRanks::work(Worker& w) {
  ops::set_cpu_thread_pool(w.pool.get());
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || generation_ != w.seen; });
    if (stopping_) return;
    w.seen = generation_;
    const SchedulerOutput& step = *step_;
    const std::vector<StateAction>& actions = *actions_;
    lk.unlock();
    std::string failed;
    try {
      w.runner->execute(step, actions);
    } catch (const std::exception& e) {
      failed = str_cat("tensor-parallel rank ", w.comm->rank(), ": ", e.what());
      group_.abort(failed);
    }
    lk.lock();
    if (!failed.empty() && error_.empty()) error_ = failed;
    if (--pending_ == 0) cv_.notify_all();
  }
}

StepLogits TensorParallelRanks::execute(const SchedulerOutput& step, const std::vector<StateAction>& actions,
                                        const std::function<StepLogits()>& run) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    RV_CHECK(error_.empty(), "tensor-parallel group failed earlier: ", error_);
    step_ = &step, actions_ = &actions;
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  StepLogits out;
  std::string failed;
  try {
    out = run();
  } catch (const std::exception& e) {
    failed = str_cat("tensor-parallel rank 0: ", e.what());
    group_.abort(failed);
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_ == 0; });
  if (!failed.empty() && error_.empty()) error_ = failed;
  if (!error_.empty()) throw DeviceError(error_);  // the group is unusable: fatal, as a device fault
  return out;
}

}  // namespace revolta
