#include "dist/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace revolta {
namespace {

void check_contiguous_host(const Tensor& t, const char* what) {
  RV_CHECK(t.defined() && t.is_contiguous() && t.device() == Device::kCPU, what,
           ": a contiguous host tensor (the local group's collectives read host memory)");
}

class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string kind() const override { return "single"; }
  void all_reduce_sum(Tensor&) override {}
  void all_gather(const Tensor& x, Tensor& out) override {
    RV_CHECK(out.nbytes() == x.nbytes(), "all_gather: out ", out.shape_str(), " for x ", x.shape_str());
    if (out.data() != x.data()) std::memcpy(out.data(), x.data(), x.nbytes());
  }
  void broadcast(Tensor&, int root) override { RV_CHECK(root == 0, "broadcast: root ", root, " of a group of one"); }
  void abort(const std::string&) override {}
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() { return std::make_unique<SingleRank>(); }

namespace {
GpuCommunicators (*g_gpu_factory)(int, bool) = nullptr;
}  // namespace

void register_gpu_communicators(GpuCommunicators (*factory)(int, bool)) { g_gpu_factory = factory; }
bool has_gpu_communicators() { return g_gpu_factory != nullptr; }

GpuCommunicators make_gpu_communicators(int world, bool custom_all_reduce) {
  if (!g_gpu_factory)
    throw std::invalid_argument(str_cat("tensor parallelism on GPUs needs NCCL, which this build did not find (install ",
                                        "nvidia-nccl-cu12 or -cu13, or set NCCL_ROOT, and rebuild)"));
  return g_gpu_factory(world, custom_all_reduce);
}

// What the ranks share: one slot per rank for the address of its tensor, a scratch row for the
// reduced sums, and a barrier (a generation count under a mutex, after a short spin: collectives
// of a decode step come every few microseconds).
struct LocalGroup::State {
  explicit State(int w) : world(w), slots(size_t(w), nullptr) {}
  const int world;
  std::vector<const void*> slots;
  std::vector<float> sum;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;

  void barrier() {
    std::unique_lock<std::mutex> lock(mu);
    if (aborted) throw std::runtime_error(reason);
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    for (int spin = 0; spin < 64 && generation == gen && !aborted; ++spin) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) throw std::runtime_error(reason);  // aborted while waiting
  }
};

namespace {

class LocalRank final : public Communicator {
 public:
  LocalRank(std::shared_ptr<LocalGroup::State> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }
  std::string kind() const override { return "local"; }

  // Reduce-scatter then gather through the shared scratch: rank r sums its share of the elements
  // over every rank's x in rank order, then every rank copies the whole sum back.
  void all_reduce_sum(Tensor& x) override {
    check_contiguous_host(x, "all_reduce_sum");
    RV_CHECK(x.dtype() == DType::kF32, "all_reduce_sum: float32, got ", dtype_name(x.dtype()));
    const int64_t n = x.numel(), W = s_->world;
    if (rank_ == 0) s_->sum.resize(size_t(n));  // (read only after the barrier below)
    s_->slots[size_t(rank_)] = x.data();
    s_->barrier();
    const int64_t begin = n * rank_ / W, end = n * (rank_ + 1) / W;
    float* sum = s_->sum.data();
    for (int64_t i = begin; i < end; ++i) sum[i] = 0.0f;
    for (int64_t r = 0; r < W; ++r) {
      const float* src = static_cast<const float*>(s_->slots[size_t(r)]);
      for (int64_t i = begin; i < end; ++i) sum[i] += src[i];
    }
    s_->barrier();  // every share summed; no rank reads x any more
    std::memcpy(x.data(), sum, size_t(n) * sizeof(float));
    s_->barrier();  // the scratch is free for the next collective
  }

  void all_gather(const Tensor& x, Tensor& out) override {
    check_contiguous_host(x, "all_gather");
    check_contiguous_host(out, "all_gather");
    const size_t bytes = x.nbytes();
    RV_CHECK(out.dtype() == x.dtype() && out.nbytes() == bytes * size_t(s_->world), "all_gather: out ",
             out.shape_str(), " for ", s_->world, " ranks of ", x.shape_str());
    s_->slots[size_t(rank_)] = x.data();
    s_->barrier();
    for (int r = 0; r < s_->world; ++r)
      std::memcpy(static_cast<char*>(out.data()) + size_t(r) * bytes, s_->slots[size_t(r)], bytes);
    s_->barrier();  // no rank changes its x while another still copies it
  }

  void broadcast(Tensor& x, int root) override {
    check_contiguous_host(x, "broadcast");
    RV_CHECK(root >= 0 && root < s_->world, "broadcast: root ", root, " of a group of ", s_->world);
    if (rank_ == root) s_->slots[size_t(root)] = x.data();
    s_->barrier();
    if (rank_ != root) std::memcpy(x.data(), s_->slots[size_t(root)], x.nbytes());
    s_->barrier();
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->aborted = true;
    s_->reason = reason;
    s_->cv.notify_all();
  }

 private:
  std::shared_ptr<LocalGroup::State> s_;
  int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int world) {
  RV_CHECK(world >= 1, "a group of ", world, " ranks");
  state_ = std::make_shared<State>(world);
}

LocalGroup::~LocalGroup() = default;

int LocalGroup::world_size() const { return state_->world; }

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
  RV_CHECK(rank >= 0 && rank < state_->world, "rank ", rank, " of a group of ", state_->world);
  return std::make_unique<LocalRank>(state_, rank);
}

void LocalGroup::abort(const std::string& reason) { LocalRank(state_, 0).abort(reason); }

}  // namespace revolta
