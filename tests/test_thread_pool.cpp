#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bie/backend/thread_pool.h"

namespace bie {
namespace {

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(1000);
  for (int rep = 0; rep < 200; ++rep) {
    pool.parallel_for(1000, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 200);
}

TEST(ThreadPool, GrainLimitsChunks) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.parallel_for(
      3, [&](int64_t, int64_t, int) { calls++; }, 8);
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace bie

namespace bie {
namespace {

TEST(ThreadPool, RunOnAllRunsEachPartOnce) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 500; ++rep) {
    std::vector<std::atomic<int>> parts(3);
    pool.run_on_all([&](int part, int n) {
      ASSERT_EQ(n, 3);
      parts[static_cast<size_t>(part)].fetch_add(1);
    });
    for (auto& p : parts) ASSERT_EQ(p.load(), 1);
  }
}

TEST(ThreadPool, ThreadIndexIsNeverSharedConcurrently) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> busy(2);
  std::atomic<bool> clash{false};
  for (int rep = 0; rep < 200; ++rep) {
    pool.parallel_for(64, [&](int64_t, int64_t, int ith) {
      if (busy[static_cast<size_t>(ith)].fetch_add(1) != 0) clash = true;
      std::this_thread::yield();  // widen the window in which a clash would show
      busy[static_cast<size_t>(ith)].fetch_sub(1);
    });
  }
  EXPECT_FALSE(clash.load());
}

TEST(ThreadPool, WorksAfterWorkersFallAsleep) {
  ThreadPool pool(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the spin window
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

}  // namespace
}  // namespace bie
