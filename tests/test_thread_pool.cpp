#include <gtest/gtest.h>

#include <atomic>
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
  pool.parallel_for(3, [&](int64_t, int64_t, int) { calls++; }, 8);
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace bie
