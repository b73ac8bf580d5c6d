// Tensor-parallel collectives between the GPUs of this process over NCCL: one communicator per
// device from ncclCommInitAll, each queuing on the work stream, so its collectives are ordered
// with the kernels around them and recorded into decode graphs. Built when CMake found NCCL.
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <stdexcept>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda_ops.h"
#include "dist/communicator.h"
#include "dist/custom_all_reduce.h"

namespace revolta::cuda {
namespace {

// The custom all-reduce takes messages up to kCustomAllReduceBytes, in one shot up to
// kOneShotBytes (a decode step's all-reduces are hidden x batch x 4 bytes: 16 KB on Qwen3-Next at
// one sequence); NCCL the larger ones. Starting points as vLLM's, to be set from
// revolta_allreduce_bench on the GPUs that serve.
constexpr size_t kOneShotBytes = size_t(256) << 10, kCustomAllReduceBytes = size_t(8) << 20;

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw DeviceError(str_cat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

void check_device(const Tensor& t, const char* what) {
  RV_CHECK(t.defined() && t.is_contiguous() && t.device() == Device::kCUDA, what,
           ": a contiguous CUDA tensor (NCCL collectives read device memory)");
}

class NcclRank final : public Communicator {
 public:
  NcclRank(ncclComm_t comm, int rank, int world, std::shared_ptr<CustomAllReduce> custom)
      : comm_(comm), rank_(rank), world_(world), custom_(std::move(custom)) {}
  ~NcclRank() override {
    if (!aborted_.exchange(true)) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string kind() const override { return "nccl"; }
  void all_reduce_sum(Tensor& x) override {
    check_device(x, "all_reduce_sum");
    RV_CHECK(x.dtype() == DType::kF32, "all_reduce_sum: float32, got ", dtype_name(x.dtype()));
    if (custom_ && x.nbytes() <= custom_->capacity_bytes())
      return launch_custom_all_reduce(custom_->peers(), rank_, x.ptr<float>(), x.numel(), stream(),
                                      x.nbytes() > kOneShotBytes);
    check(ncclAllReduce(x.data(), x.data(), size_t(x.numel()), ncclFloat32, ncclSum, comm_, stream()), "all-reduce");
  }
  void all_gather(const Tensor& x, Tensor& out) override {
    check_device(x, "all_gather");
    check_device(out, "all_gather");
    RV_CHECK(out.nbytes() == x.nbytes() * size_t(world_), "all_gather: out ", out.shape_str(), " for ", world_,
             " ranks of ", x.shape_str());
    check(ncclAllGather(x.data(), out.data(), x.nbytes(), ncclChar, comm_, stream()), "all-gather");
  }
  void broadcast(Tensor& x, int root) override {
    check_device(x, "broadcast");
    RV_CHECK(root >= 0 && root < world_, "broadcast: root ", root, " of ", world_, " ranks");
    check(ncclBroadcast(x.data(), x.data(), x.nbytes(), ncclChar, root, comm_, stream()), "broadcast");
  }

  // Ends this rank's queued and running collectives (the others' are aborted by their own calls).
  void abort(const std::string&) override {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

 private:
  ncclComm_t comm_;
  int rank_, world_;
  std::shared_ptr<CustomAllReduce> custom_;  // small messages, where the GPUs reach each other
  std::atomic<bool> aborted_{false};
};


GpuCommunicators make(int world, bool custom_all_reduce) {
  int devices = 0;
  RV_CUDA_CHECK(cudaGetDeviceCount(&devices));
  RV_CHECK_ARG(world >= 1 && world <= devices, "tensor_parallel_size ", world, ": this machine has ", devices,
               " CUDA device(s)");
  std::vector<ncclComm_t> comms(static_cast<size_t>(world));
  std::vector<int> ids(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) ids[size_t(r)] = r;
  check(ncclCommInitAll(comms.data(), world, ids.data()), "init");
  // REVOLTA_CUSTOM_ALL_REDUCE=0 leaves every all-reduce to NCCL (a process-wide off switch).
  const char* env = std::getenv("REVOLTA_CUSTOM_ALL_REDUCE");
  std::shared_ptr<CustomAllReduce> custom;
  if (world > 1 && custom_all_reduce && !(env && std::string(env) == "0"))
    custom = CustomAllReduce::create(ids, kCustomAllReduceBytes);
  GpuCommunicators out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<NcclRank>(comms[size_t(r)], r, world, custom));
  return out;
}

struct Registration {
  Registration() { register_gpu_communicators(&make); }
} registration;

}  // namespace
}  // namespace revolta::cuda
