// An all-reduce for small messages between the GPUs of one process, without NCCL's protocol: every
// rank stages its tensor in a buffer its peers can read (peer access over NVLink or PCIe), the
// blocks of the ranks meet at flags in each other's memory, and each rank sums every rank's buffer
// in rank order (one shot: one read of each peer's data, two flag round trips; two shots for larger
// messages: reduce-scatter, then gather; all ranks get the same bits). Meeting counts live in device
// memory, so decode graphs record and replay it. NCCL carries what it does not take (larger
// messages, GPUs without peer access).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace revolta::cuda {

constexpr int kMaxCustomRanks = 8;
constexpr int kCustomBlocks = 32;  // blocks per rank (the same grid on every rank)

// What a rank's kernel reads: every rank's staging buffer and flags (pointers valid on every rank's
// device), its own call counters.
struct PeerBuffers {
  int world = 0;
  float* data[kMaxCustomRanks] = {};
  uint64_t* flags[kMaxCustomRanks] = {};  // [kCustomBlocks][kMaxCustomRanks] a rank
  uint64_t* counts[kMaxCustomRanks] = {};  // [kCustomBlocks] a rank: its blocks' last meeting (64-bit: never wraps)
};

// Queues rank `rank`'s part of the all-reduce of x (n floats on its device, n * 4 <= the buffers'
// capacity) on `stream`; every rank must queue its own with the same n and form. two_shot: each
// rank sums a 1 / world chunk and gathers the others' (reads (2 / world) of the data one shot
// reads, one more meeting), for larger messages.
void launch_custom_all_reduce(const PeerBuffers& peers, int rank, float* x, int64_t n, cudaStream_t stream,
                              bool two_shot = false);

// The buffers of `world` ranks, rank r's on device devices[r] (allocated there and zeroed), for
// messages of up to `capacity_bytes`; null when some pair of devices cannot reach each other's
// memory (enables peer access between every pair otherwise).
class CustomAllReduce {
 public:
  static std::shared_ptr<CustomAllReduce> create(const std::vector<int>& devices, size_t capacity_bytes);
  ~CustomAllReduce();
  const PeerBuffers& peers() const { return peers_; }
  size_t capacity_bytes() const { return capacity_; }

 private:
  PeerBuffers peers_;
  std::vector<int> devices_;
  size_t capacity_ = 0;
};

}  // namespace revolta::cuda
