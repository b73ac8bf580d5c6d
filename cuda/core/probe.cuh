// Phase timestamps inside the decode kernels, for a build configured with -DREVOLTA_PROBE=ON
// (without it every macro here compiles to nothing). A kernel profile (CUPTI) sees a kernel's start
// and end; with dependent launch the kernels of a step overlap, and the question is what happens
// in between: when a block's wait returns, when its group lets it on, when its bytes are in.
// Thread 0 of a block marks points in shared memory (a read of the global timer); when the block
// leaves, it appends its marks to one log in device memory with a single atomic, and the exit
// time as point kProbePoints - 1. cuda::probe_enable() starts the log; revolta_bench --probe FILE writes the log of a few decode steps
// and benchmarks/probe_summary.py summarises it per kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_ops.h"

namespace revolta::cuda {

// The kernels instrumented (a record's kind).
enum class ProbeKind : uint16_t { kGdnDecode = 1, kMoeRouteExperts = 2, kGemvRow = 3, kDecodeAttention = 4, kQkvRopeCache = 5 };

constexpr int kProbePoints = 12;  // the last is the block's exit

struct ProbeLog {
  unsigned int count, capacity;
  ProbeRecord* records;  // [capacity]
};

// Adds a translation unit's binder to those probe_enable() calls (RV_PROBE_TU).
bool probe_register(void (*bind)(ProbeLog* log));

#if defined(REVOLTA_PROBE)
// Each translation unit has its own copy of the log's address (there is no separate device
// linking): RV_PROBE_TU() at namespace scope registers this unit's binder, which probe_enable()
// calls before any kernel runs (no copy to a symbol can happen later, inside a graph capture).
static __device__ ProbeLog* g_probe_log = nullptr;

static inline void probe_bind_here(ProbeLog* log) { cudaMemcpyToSymbol(g_probe_log, &log, sizeof(log)); }

__device__ __forceinline__ uint64_t probe_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The block's marks (one array per kernel: the function is inlined into each).
__device__ __forceinline__ uint64_t* probe_marks() {
  __shared__ uint64_t marks[kProbePoints];
  return marks;
}

__device__ __forceinline__ void probe_mark(int point) {
  if (threadIdx.x == 0) probe_marks()[point] = probe_now();
}

// Declared at a kernel's start by all its threads; logs the block's marks when the kernel's scope
// ends, whichever return it takes.
struct ProbeBlock {
  ProbeKind kind;
  __device__ explicit ProbeBlock(ProbeKind k) : kind(k) {
    if (threadIdx.x < kProbePoints) probe_marks()[threadIdx.x] = 0;
    __syncthreads();
    probe_mark(0);
  }
  __device__ ~ProbeBlock() {
    if (threadIdx.x != 0 || !g_probe_log) return;
    uint64_t* marks = probe_marks();
    marks[kProbePoints - 1] = probe_now();
    int n = 0;
    for (int p = 0; p < kProbePoints; ++p) n += marks[p] != 0;
    // A block at the end of a full log writes the records that fit (every slot the reader takes is
    // then written); without its exit record, the summary leaves it out.
    unsigned at = atomicAdd(&g_probe_log->count, unsigned(n));
    const uint32_t block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    for (int p = 0; p < kProbePoints && at < g_probe_log->capacity; ++p)
      if (marks[p]) g_probe_log->records[at++] = ProbeRecord{uint16_t(kind), uint16_t(p), block, marks[p]};
  }
};
#define RV_PROBE_BLOCK(kind) const ::revolta::cuda::ProbeBlock rv_probe_block_(kind)
#define RV_PROBE_MARK(point) ::revolta::cuda::probe_mark(point)
#define RV_PROBE_TU() \
  static const bool rv_probe_tu_ = ::revolta::cuda::probe_register(&::revolta::cuda::probe_bind_here)
#else
#define RV_PROBE_BLOCK(kind) ((void)0)
#define RV_PROBE_MARK(point) ((void)0)
#define RV_PROBE_TU() static_assert(true, "")
#endif

}  // namespace revolta::cuda
