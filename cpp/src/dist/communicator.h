// Collectives among the ranks of a tensor-parallel group: the seam between sharded models and the
// transport (ranks as threads over shared memory here; NCCL and a custom all-reduce on GPUs).
// Every rank calls the same collectives in the same order with tensors of the same shape, as
// NCCL requires; results are the same bits on every rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace revolta {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string kind() const = 0;  // "single", "local", ...
  // x (float32, contiguous) becomes the elementwise sum over the ranks, summed in rank order.
  virtual void all_reduce_sum(Tensor& x) = 0;
  // out = the ranks' x (contiguous, any element type) one after another in rank order:
  // x [n, ...] -> out [world * n, ...].
  virtual void all_gather(const Tensor& x, Tensor& out) = 0;
  // x becomes root's x on every rank.
  virtual void broadcast(Tensor& x, int root) = 0;
  // One rank failed: collectives waiting on any rank of the group, and later ones, fail instead of
  // waiting for it (callable from any thread; the group stays unusable).
  virtual void abort(const std::string& reason) = 0;
};

// A group of one: the collectives leave x as it is (all_gather copies).
std::unique_ptr<Communicator> make_single_rank_communicator();

// Communicators of `world` GPU ranks of this process, rank r on CUDA device r, over NCCL, in rank
// order; their collectives take device tensors and queue on the device's work stream (so decode
// graphs record them). custom_all_reduce: all-reduces of small messages take the one-shot kernel
// over peer-mapped buffers (cuda/dist/custom_all_reduce.h) where every pair of GPUs has peer
// access. The CUDA backend registers the factory when the build found NCCL; without it this throws
// std::invalid_argument naming NCCL.
using GpuCommunicators = std::vector<std::unique_ptr<Communicator>>;
GpuCommunicators make_gpu_communicators(int world, bool custom_all_reduce = true);
bool has_gpu_communicators();
void register_gpu_communicators(GpuCommunicators (*factory)(int world, bool custom_all_reduce));

// `world` ranks inside one process, each on a thread of its own, over host memory (CPU serving and
// the tests of sharded models). communicator(r) is rank r's; a collective returns on a rank once
// every rank has reached it and the data it reads is in place. abort(reason) makes every waiting
// and later collective throw std::runtime_error(reason), so one rank's failure cannot leave the
// others waiting forever.
class LocalGroup {
 public:
  explicit LocalGroup(int world);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int world_size() const;
  std::unique_ptr<Communicator> communicator(int rank);
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace revolta
