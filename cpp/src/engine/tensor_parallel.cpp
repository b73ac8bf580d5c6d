#include "engine/tensor_parallel.h"

#include <algorithm>

#include "core/device_runtime.h"
#include "core/error.h"
#include "ops/ops.h"

namespace revolta {

struct TensorParallelRanks::Worker {
  int rank = 0;
  Communicator* comm = nullptr;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<CacheCoordinator> caches;  // only its storage is used: the blocks are rank 0's
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<ThreadPool> pool;
  Tensor step_hidden;  // of its last forward, and its last draft_forward's output (MTP drafting)
  Tensor ids;          // the greedy ids of its last forward's logits (async scheduling)
  ForwardOutput draft;
  uint64_t seen = 0;
  std::thread thread;
};

TensorParallelRanks::TensorParallelRanks(int world, Device device, const Loader& load, int threads_per_rank,
                                         int block_activation_bits)
    : device_(device), block_activation_bits_(block_activation_bits) {
  if (device == Device::kCPU) {
    local_ = std::make_unique<LocalGroup>(world);
    for (int r = 0; r < world; ++r) comms_.push_back(local_->communicator(r));
  } else {
    comms_ = make_gpu_communicators(world);  // rank r on GPU r
  }
  for (int r = 1; r < world; ++r) {
    auto w = std::make_unique<Worker>();
    w->rank = r;
    w->comm = comms_[size_t(r)].get();
    w->pool = std::make_unique<ThreadPool>(std::max(1, threads_per_rank));
    workers_.push_back(std::move(w));
  }
  for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { work(*p); });
  // The shards load on their ranks' threads (their devices), rank 0's later on the engine thread.
  try {
    run_all([&](Worker& w) { w.model = load(w.comm); }, [] {});
  } catch (...) {
    stop();  // no destructor runs for a constructor that throws
    throw;
  }
}

TensorParallelRanks::~TensorParallelRanks() { stop(); }

void TensorParallelRanks::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
}

int64_t TensorParallelRanks::worker_weight_bytes() const {
  int64_t n = 0;
  for (const auto& w : workers_) n += w->model->weight_bytes();
  return n;
}

void TensorParallelRanks::on_models(const std::function<void(CausalLM&, int rank)>& fn, CausalLM& rank0) {
  run_all([&](Worker& w) { fn(*w.model, w.rank); }, [&] { fn(rank0, 0); });
}

void TensorParallelRanks::make_runners(const CachePlan& plan, const CacheLimits& limits, const RunnerOptions& ropts,
                                       const std::vector<std::pair<float, float>>& kv_scales) {
  run_all(
      [&](Worker& w) {
        w.caches = std::make_unique<CacheCoordinator>(plan, limits, w.model->device());
        set_kv_scales(kv_scales, w.caches->kv());  // (rank 0 reports the layers without)
        w.runner = std::make_unique<ModelRunner>(*w.model, w.caches->kv(), w.caches->states(), ropts);
      },
      [] {});
}

void TensorParallelRanks::drop(bool models) {
  run_all(
      [&](Worker& w) {
        w.runner.reset();
        w.caches.reset();
        w.step_hidden = Tensor();
        w.ids = Tensor();
        w.draft = ForwardOutput();
        if (models) w.model.reset();
        if (device_ != Device::kCPU) device_runtime(device_).release_cached();
      },
      [] {});
}

void TensorParallelRanks::capture_graphs(const std::function<void()>& rank0) {
  run_all([](Worker& w) { w.runner->capture_graphs(); }, rank0);
}

StepLogits TensorParallelRanks::execute(const SchedulerOutput& step, const std::vector<StateAction>& actions,
                                        const std::function<StepLogits()>& run, bool fed) {
  StepLogits out;
  run_all(
      [&](Worker& w) {
        RV_CHECK(!fed || w.ids.defined(), "tensor-parallel rank ", w.rank, ": no greedy ids to feed");
        StepLogits mine = w.runner->execute(step, actions, fed ? &w.ids : nullptr);
        w.step_hidden = mine.hidden;
        if (keep_ids_ && mine.logits.defined() && mine.logits.size(0) > 0) {
          w.ids = Tensor::uninitialized({mine.logits.size(0)}, DType::kI32, mine.logits.device());
          ops::argmax(mine.logits, w.ids);
        }
      },
      [&] { out = run(); }, true);
  return out;
}

ForwardOutput TensorParallelRanks::draft_forward(const std::vector<DraftSpan>& spans, const std::vector<int32_t>& rows,
                                                 bool from_step, int32_t layer, const std::function<ForwardOutput()>& rank0) {
  ForwardOutput out;
  run_all(
      [&](Worker& w) {
        const Tensor& src = from_step ? w.step_hidden : w.draft.hidden;
        Tensor ids = Tensor::empty({int64_t(rows.size())}, DType::kI32);
        std::copy(rows.begin(), rows.end(), ids.ptr<int32_t>());
        Tensor h = Tensor::uninitialized({int64_t(rows.size()), src.size(1)}, DType::kF32, src.device());
        ops::gather_rows(src, ids.to(src.device()), h);
        w.draft = w.runner->draft_forward(spans, h, layer);
      },
      [&] { out = rank0(); }, true);
  return out;
}

std::vector<std::unique_ptr<PendingCopy>> TensorParallelRanks::run_transfers(
    const std::vector<BlockTransfer>& transfers, const std::vector<StateAction>& snapshots,
    const std::function<std::unique_ptr<PendingCopy>()>& rank0) {
  std::vector<std::unique_ptr<PendingCopy>> pending(workers_.size() + 1);
  run_all(
      [&](Worker& w) {
        if (!snapshots.empty()) w.caches->states()->apply(snapshots);
        pending[size_t(w.rank)] = revolta::run_transfers(transfers, w.caches->kv(), w.caches->states(), w.rank);
      },
      [&] { pending[0] = rank0(); }, true);
  return pending;
}

void TensorParallelRanks::roll_back(const std::vector<StateAction>& restores, const std::vector<StateReplay>& replays,
                                    const std::function<void()>& rank0) {
  run_all(
      [&](Worker& w) {
        w.caches->states()->apply(restores);
        w.runner->replay_states(replays);
      },
      rank0, true);
}

void TensorParallelRanks::work(Worker& w) {
  ops::set_cpu_thread_pool(w.pool.get());
  ops::set_cpu_block_activation_bits(block_activation_bits_);
  std::string failed;
  try {
    if (device_ != Device::kCPU) device_runtime(device_).use_device(w.rank);
  } catch (const std::exception& e) {
    failed = str_cat("tensor-parallel rank ", w.rank, ": ", e.what());
  }
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || generation_ != w.seen; });
    if (stopping_) return;
    w.seen = generation_;
    const std::function<void(Worker&)>& job = *job_;
    lk.unlock();
    std::exception_ptr thrown;
    if (failed.empty()) {
      try {
        job(w);
      } catch (const std::exception& e) {
        failed = str_cat("tensor-parallel rank ", w.rank, ": ", e.what());
        thrown = std::current_exception();
      }
    }
    if (!failed.empty()) abort_all(failed);  // no rank stays waiting in a collective for this one
    lk.lock();
    if (!failed.empty() && error_.empty()) error_ = failed, first_ = thrown;
    if (--pending_ == 0) cv_.notify_all();
  }
}

void TensorParallelRanks::abort_all(const std::string& reason) {
  for (auto& c : comms_) c->abort(reason);
}

void TensorParallelRanks::run_all(const std::function<void(Worker&)>& job, const std::function<void()>& rank0, bool fatal) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    RV_CHECK(error_.empty(), "tensor-parallel group failed earlier: ", error_);
    job_ = &job;
    pending_ = int(workers_.size());
    ++generation_;
  }
  cv_.notify_all();
  std::string failed;
  std::exception_ptr thrown;
  try {
    rank0();
  } catch (const std::exception& e) {
    failed = str_cat("tensor-parallel rank 0: ", e.what());
    thrown = std::current_exception();
    {
      std::lock_guard<std::mutex> lk(mu_);  // the cause, before the aborts it makes the others report
      if (error_.empty()) error_ = failed, first_ = thrown;
    }
    abort_all(failed);
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_ == 0; });
  if (error_.empty()) return;
  // The group is unusable: a failed step is fatal, as a device fault; at startup the error is the
  // failing rank's own (a bad option, a missing tensor).
  if (!fatal && first_) std::rethrow_exception(first_);
  throw DeviceError(error_);
}

}  // namespace revolta
