#include "bie/backend/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cassert>

namespace bie {

namespace {

constexpr int kSpinIterations = 20000;
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kMaxChunks = 0xFFFF;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

inline uint64_t gen_of(uint64_t s) {
  return s >> 32;
}
inline int64_t next_of(uint64_t s) {
  return static_cast<int64_t>((s >> 16) & 0xFFFF);
}
inline int64_t count_of(uint64_t s) {
  return static_cast<int64_t>(s & 0xFFFF);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    state_.fetch_add(uint64_t{1} << 32);  // new generation with no chunks wakes everyone
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work(uint64_t gen, int thread_index) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (gen_of(s) != gen || next_of(s) >= count_of(s)) return;
    if (!state_.compare_exchange_weak(s, s + (uint64_t{1} << 16), std::memory_order_acq_rel))
      continue;
    // Chunk claimed: the job cannot complete (nor job_ change) until we report it done.
    const int64_t c = next_of(s);
    const Job& job = job_;
    const int64_t begin = c * job.chunk;
    const int64_t end = std::min(job.n, begin + job.chunk);
    if (job.by_part) {
      (*job.part_fn)(static_cast<int>(c), static_cast<int>(job.n));
    } else {
      (*job.fn)(begin, end, thread_index);
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (gen_of(state_.load(std::memory_order_acquire)) == seen && spins < kSpinIterations) {
      cpu_relax();
      ++spins;
    }
    if (gen_of(state_.load(std::memory_order_acquire)) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return gen_of(state_.load()) != seen; });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen_of(state_.load(std::memory_order_acquire));
    work(seen, index);
  }
}

void ThreadPool::run_job(const Job& job, int64_t n_chunks) {
  assert(n_chunks > 0 && n_chunks <= kMaxChunks);
  job_ = job;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = gen_of(state_.load(std::memory_order_relaxed)) + 1;
  state_.store((gen << 32) | static_cast<uint64_t>(n_chunks));  // seq_cst: pairs with sleepers_
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  work(gen, 0);
  while (done_.load(std::memory_order_acquire) < n_chunks) cpu_relax();
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  if (n_threads_ == 1 || max_chunks <= 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t want = std::min({max_chunks, kChunksPerThread * n_threads_, kMaxChunks});
  Job job;
  job.fn = &fn;
  job.n = n;
  job.chunk = (n + want - 1) / want;
  run_job(job, (n + job.chunk - 1) / job.chunk);
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  Job job;
  job.by_part = true;
  job.part_fn = &fn;
  job.n = n_threads_;
  job.chunk = 1;
  run_job(job, n_threads_);
}

int default_thread_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace bie
