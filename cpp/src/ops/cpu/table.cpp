#include "core/thread_pool.h"
#include "ops/cpu/cpu_ops.h"

namespace revolta::ops::cpu {

void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (ThreadPool* pool = cpu_thread_pool()) pool->parallel_range(n, grain, fn);
  else if (n > 0) fn(0, n);
}

void parallel_tasks(int64_t n, const std::function<void(int64_t)>& fn) {
  if (ThreadPool* pool = cpu_thread_pool()) pool->parallel_for(n, fn);
  else
    for (int64_t t = 0; t < n; ++t) fn(t);
}

const OpTable* table() {
  static const OpTable t = [] {
    OpTable table;
    REVOLTA_OPS(REVOLTA_TABLE_ENTRY)
    return table;
  }();
  return &t;
}

}  // namespace revolta::ops::cpu
