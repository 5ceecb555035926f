// ThreadPool: a fixed set of worker threads that run one data-parallel job at a time.
// Owns its threads. Jobs are split into chunks that threads claim dynamically, and the calling
// thread claims chunks too: when a worker is descheduled (a busy machine) or asleep, the caller
// does its share instead of waiting for it to wake up. Workers spin briefly before sleeping so
// that the hundreds of small jobs of a decode step do not each pay a futex wake-up.
// parallel_for()/run_parts() must be called from one thread at a time (the engine thread).
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
  // fn(begin, end, thread_index): process items [begin, end). thread_index < size() identifies
  // the executing thread (for per-thread scratch); one thread runs its chunks one after another.
  using RangeFn = std::function<void(int64_t, int64_t, int)>;

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] int size() const { return n_threads_; }

  // Splits [0, n) into contiguous chunks of at least `grain` items (a few per thread) and runs
  // fn on each, on whichever threads are free. Returns when all chunks are done.
  void parallel_for(int64_t n, const RangeFn& fn, int64_t grain = 1);

  // Runs fn(part, size()) for every part in [0, size()), each exactly once, on whichever
  // threads are free; `part` may index per-part scratch (no two runs share a part).
  void run_on_all(const std::function<void(int, int)>& fn);

 private:
  struct Job {
    const RangeFn* fn = nullptr;
    int64_t n = 0;
    int64_t chunk = 1;
    bool by_part = false;  // run_on_all: pass the chunk index instead of the thread index
    const std::function<void(int, int)>* part_fn = nullptr;
  };

  void worker_loop(int index);
  // Claims and runs chunks of job generation `gen` until none are left.
  void work(uint64_t gen, int thread_index);
  void run_job(const Job& job, int64_t n_chunks);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  Job job_;
  // state_ = generation << 32 | next chunk << 16 | chunk count (both < 2^16).
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

// Number of threads to use when the user gives none: the cores we may run on.
[[nodiscard]] int default_thread_count();

}  // namespace bie
