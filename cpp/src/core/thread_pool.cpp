#include "core/thread_pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RV_CPU_RELAX() _mm_pause()
#else
#define RV_CPU_RELAX() std::this_thread::yield()
#endif

namespace revolta {
namespace {
constexpr int kSpinIterations = 1 << 15;
}

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  epoch_.fetch_add(1);
  epoch_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks() {
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) break;
    (*job_)(task);
  }
}

void ThreadPool::worker_loop() {
  uint32_t seen = epoch_.load();
  for (;;) {
    uint32_t now = epoch_.load(std::memory_order_acquire);
    for (int spin = 0; now == seen && spin < kSpinIterations; ++spin) {
      RV_CPU_RELAX();
      now = epoch_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      epoch_.wait(seen);
      now = epoch_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load()) return;
    run_tasks();
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  job_ = &fn;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(int32_t(workers_.size()), std::memory_order_relaxed);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  run_tasks();
  int32_t busy = busy_workers_.load(std::memory_order_acquire);
  for (int spin = 0; busy != 0 && spin < kSpinIterations; ++spin) {
    RV_CPU_RELAX();
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  while (busy != 0) {
    busy_workers_.wait(busy);
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::parallel_range(int64_t n, int64_t grain,
                                const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(size()) * 4);
  if (chunks < 1) chunks = 1;
  int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  parallel_for(chunks, [&](int64_t c) {
    int64_t b = c * per;
    fn(b, std::min(n, b + per));
  });
}

}  // namespace revolta
