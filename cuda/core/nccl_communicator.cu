// Tensor-parallel collectives between the GPUs of this process over NCCL: one communicator per
// device from ncclCommInitAll, each queuing on the work stream, so its collectives are ordered
// with the kernels around them and recorded into decode graphs. Built when CMake found NCCL.
#include <nccl.h>

#include <atomic>
#include <stdexcept>

#include "core/cuda_check.h"
#include "core/error.h"
#include "cuda_ops.h"
#include "dist/communicator.h"

namespace revolta::cuda {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw DeviceError(str_cat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

void check_device(const Tensor& t, const char* what) {
  RV_CHECK(t.defined() && t.is_contiguous() && t.device() == Device::kCUDA, what,
           ": a contiguous CUDA tensor (NCCL collectives read device memory)");
}

class NcclRank final : public Communicator {
 public:
  NcclRank(ncclComm_t comm, int rank, int world) : comm_(comm), rank_(rank), world_(world) {}
  ~NcclRank() override {
    if (!aborted_.exchange(true)) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string kind() const override { return "nccl"; }
  void all_reduce_sum(Tensor& x) override {
    check_device(x, "all_reduce_sum");
    RV_CHECK(x.dtype() == DType::kF32, "all_reduce_sum: float32, got ", dtype_name(x.dtype()));
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
  std::atomic<bool> aborted_{false};
};

GpuCommunicators make(int world) {
  int devices = 0;
  RV_CUDA_CHECK(cudaGetDeviceCount(&devices));
  RV_CHECK_ARG(world >= 1 && world <= devices, "tensor_parallel_size ", world, ": this machine has ", devices,
               " CUDA device(s)");
  std::vector<ncclComm_t> comms(static_cast<size_t>(world));
  std::vector<int> ids(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) ids[size_t(r)] = r;
  check(ncclCommInitAll(comms.data(), world, ids.data()), "init");
  GpuCommunicators out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<NcclRank>(comms[size_t(r)], r, world));
  return out;
}

struct Registration {
  Registration() { register_gpu_communicators(&make); }
} registration;

}  // namespace
}  // namespace revolta::cuda
