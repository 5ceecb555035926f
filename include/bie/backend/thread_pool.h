// ThreadPool: a fixed set of worker threads that run one data-parallel job at a time.
// Owns its threads. parallel_for() must be called from one thread at a time (the engine thread);
// the calling thread takes part as worker 0. Workers spin briefly before sleeping so that the
// hundreds of small jobs of a decode step do not pay a futex wake-up each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bie {

class ThreadPool {
 public:
  // fn(begin, end, thread_index): process items [begin, end).
  using RangeFn = std::function<void(int64_t, int64_t, int)>;

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] int size() const { return n_threads_; }

  // Splits [0, n) into contiguous chunks of at least `grain` items, one per thread at most,
  // and runs fn on each. Returns when all chunks are done.
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

  // Runs fn(thread_index, n_threads) once on every thread.
  void run_on_all(const std::function<void(int, int)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// Number of threads to use when the user gives none: the physical cores we can run on.
[[nodiscard]] int default_thread_count();

}  // namespace bie
