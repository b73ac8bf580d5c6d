// What the engine needs from a device backend besides its op table: transfers, synchronisation,
// memory figures and captured graphs. A backend registers one; core code stays free of any
// vendor header (the CUDA backend implements it in cuda/core/).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace revolta {

// A recorded sequence of device work replayed as one launch (a CUDA graph). Buffers allocated
// while it was recorded stay reserved for it until it is destroyed.
struct DeviceGraph {
  virtual ~DeviceGraph() = default;
  virtual void replay() = 0;
};

// Device memory that several graphs share. They replay one at a time in the device's work order
// and what one graph's outputs hold is read before the next replays, so a recording may reuse any
// block of it, including those another graph's outputs keep.
struct GraphMemory {
  virtual ~GraphMemory() = default;
  virtual size_t bytes() const = 0;
};

// A device -> host copy queued in the device's work order while the host goes on (async
// scheduling reads a step's tokens while the next step is already queued). Dropping it unwaited
// is allowed: the copy then lands nowhere the caller can see.
struct PendingCopy {
  virtual ~PendingCopy() = default;
  // Returns once the destination holds the bytes.
  virtual void wait() = 0;
};

// One piece of a batched copy: host memory and a device address of the same size.
struct CopyPiece {
  void* host;
  void* device;
  size_t bytes;
};

struct DeviceRuntime {
  virtual ~DeviceRuntime() = default;
  virtual std::string name() const = 0;
  // Copies in the device's work order; host -> device returns once src may be reused,
  // device -> host returns once dst holds the bytes.
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  // Returns at once; dst must stay valid until the copy's wait() returns or the copy is dropped.
  virtual std::unique_ptr<PendingCopy> copy_to_host_later(void* dst, const void* src, size_t bytes) = 0;
  // Many small copies (KV blocks, state slots) as a few staged transfers, in the device's work order.
  // upload returns once the host pieces may be reused; a download's host pieces hold the bytes once
  // its wait() returns.
  virtual void upload_pieces(const std::vector<CopyPiece>& pieces) = 0;
  virtual std::unique_ptr<PendingCopy> download_pieces(const std::vector<CopyPiece>& pieces) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;
  // Free and total device memory; cached (freed, reusable) blocks count as free.
  virtual void memory_info(size_t* free_bytes, size_t* total_bytes) = 0;
  // Gives the calling thread's device the freed blocks its allocator keeps for reuse.
  virtual void release_cached() {}
  // Runs `work` once to size its buffers, then records it into a graph. Its buffers come from
  // `shared` when given (graph_memory()), else they are the graph's own.
  virtual std::shared_ptr<GraphMemory> graph_memory() = 0;
  virtual std::unique_ptr<DeviceGraph> capture(const std::function<void()>& work,
                                               const std::shared_ptr<GraphMemory>& shared = nullptr) = 0;
  // Page-locked host memory, freed when the last reference goes.
  virtual std::shared_ptr<void> pinned_host(size_t bytes) = 0;
  // Host work in the device's work order, recorded like a kernel while a graph is captured: the
  // `in_bytes` at device `src` copied into host `in`, then fn(arg) on a runtime thread (which may
  // not call the device), then the `out_bytes` at host `out` copied to device `dst`. in and out are
  // pinned_host() memory; they and arg outlive every replay of a graph that records them.
  virtual void host_stage(const void* src, void* in, size_t in_bytes, void (*fn)(void*), void* arg, const void* out,
                          void* dst, size_t out_bytes) = 0;
  // Devices of this kind on the machine, and the one the calling thread's work, memory and graphs
  // go to from now on (0 until a thread chooses: a tensor-parallel rank's thread takes its rank's).
  virtual int device_count() = 0;
  virtual void use_device(int index) = 0;
};

void register_device_runtime(Device device, DeviceRuntime* runtime);
// Throws when the build has no backend for the device.
DeviceRuntime& device_runtime(Device device);
bool has_device(Device device);

}  // namespace revolta
