// One accounting: what the engine's KV cache allocates equals what the planner predicts.
#include <gtest/gtest.h>

#include "bie/kv/contiguous_kv_cache.h"
#include "bie/model/model.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/model_geometry.h"
#include "support/paths.h"

namespace bie {
namespace {

TEST(KvAccounting, ContiguousCacheEqualsPlannerOnSmolLM2) {
  auto model = load_model(test::smollm2_path());
  ASSERT_TRUE(model.ok()) << model.error();
  auto geo = planner::geometry_from_gguf((*model)->file());
  ASSERT_TRUE(geo.ok()) << geo.error();
  for (int64_t n_ctx : {1, 16, 4096, 8192}) {
    ContiguousKvCache kv((*model)->hparams().kv_geometry(), n_ctx);
    EXPECT_EQ(kv.allocated_bytes(),
              planner::contiguous_kv_bytes(*geo, planner::kKvF16, planner::kKvF16, n_ctx, 1))
        << n_ctx;
  }
  ContiguousKvCache kv8k((*model)->hparams().kv_geometry(), 8192);
  EXPECT_EQ(kv8k.allocated_bytes(), 188743680u);  // 23,040 B/token x 8192
}

}  // namespace
}  // namespace bie
