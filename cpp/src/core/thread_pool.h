// A fork-join pool for the engine thread's ops. Workers spin briefly before sleeping because a
// decode step issues a few hundred short parallel sections; a sleep/wake per section would cost
// more than the work.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace revolta {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 1 means everything runs inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(task) for every task in [0, n_tasks), spread over all threads; returns when all
  // are done. Not reentrant: fn must not call back into the pool.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn);

  // Splits [0, n) into about size() * 4 ranges of at least grain elements.
  void parallel_range(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_tasks();

  std::vector<std::thread> workers_;
  // Sleeping uses raw futexes with a sleeper count checked after each change, so a change is
  // never missed and no syscall is made while everybody spins.
  std::atomic<uint32_t> epoch_{0};
  std::atomic<int64_t> next_task_{0};
  std::atomic<uint32_t> busy_workers_{0};
  std::atomic<int32_t> sleeping_workers_{0};
  std::atomic<int32_t> caller_sleeping_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_tasks_ = 0;
};

}  // namespace revolta
