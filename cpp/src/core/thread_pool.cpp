#include "core/thread_pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RV_CPU_RELAX() _mm_pause()
#else
#define RV_CPU_RELAX() std::this_thread::yield()
#endif

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace revolta {
namespace {
constexpr int kSpinIterations = 1 << 15;

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
  // Returns at once if the word no longer holds `expected` (checked atomically by the kernel).
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  epoch_.fetch_add(1);
  futex_wake_all(epoch_);
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
  // Epochs are counted from construction: a worker that starts late must still see the first one.
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = epoch_.load(std::memory_order_acquire);
    for (int spin = 0; now == seen && spin < kSpinIterations; ++spin) {
      RV_CPU_RELAX();
      now = epoch_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      sleeping_workers_.fetch_add(1);
      futex_wait(epoch_, seen);
      sleeping_workers_.fetch_sub(1);
      now = epoch_.load();
    }
    seen = now;
    if (stop_.load()) return;
    run_tasks();
    if (busy_workers_.fetch_sub(1) == 1 && caller_sleeping_.load() > 0) futex_wake_all(busy_workers_);
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
  busy_workers_.store(uint32_t(workers_.size()));
  epoch_.fetch_add(1);
  if (sleeping_workers_.load() > 0) futex_wake_all(epoch_);
  run_tasks();
  uint32_t busy = busy_workers_.load(std::memory_order_acquire);
  for (int spin = 0; busy != 0 && spin < kSpinIterations; ++spin) {
    RV_CPU_RELAX();
    busy = busy_workers_.load(std::memory_order_acquire);
  }
  while (busy != 0) {
    caller_sleeping_.fetch_add(1);
    futex_wait(busy_workers_, busy);
    caller_sleeping_.fetch_sub(1);
    busy = busy_workers_.load();
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
