// Greedy requests on two engines (a device and the CPU) and the check that holds them to each
// other: the same tokens, except after a step where the CPU's top-2 margin is a near-tie (below
// the model's llama.cpp self-agreement floor), where float summation order may pick either.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "bie/engine/engine.h"
#include "support/generate.h"
#include "bie/engine/model_path.h"
#include "bie/tokenizer/tokenizer.h"
#include "support/contiguous_kv_cache.h"
#include "support/engine_collect.h"

namespace bie::test {

// Every prompt submitted at once (greedy, max_tokens each); their tokens, in prompt order.
inline std::vector<std::vector<int32_t>> run_greedy(Engine& eng,
                                                    std::span<const char* const> prompts,
                                                    int max_tokens) {
  std::vector<std::unique_ptr<Collected>> cs;
  RequestId id = 1;
  for (const char* p : prompts) {
    EngineRequest r;
    r.prompt = eng.tokenizer().encode(p);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    cs.push_back(std::make_unique<Collected>());
    EXPECT_FALSE(eng.submit(id++, r, collect(*cs.back())).has_value());
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& c : cs) {
    c->wait();
    EXPECT_TRUE(c->finish.has_value() && c->finish->error.empty())
        << (c->finish ? c->finish->error : "no finish");
    out.push_back(c->tokens);
  }
  return out;
}

// Compares the device's tokens (got) with the CPU's (want) for each prompt: every request has
// max_tokens tokens, and where the two differ, the CPU model's (f16 KV, scalar-checked path)
// top-2 margin at the first differing step is below margin_floor. Returns how many are identical.
inline int identical_where_margins_allow(const std::vector<std::vector<int32_t>>& want,
                                         const std::vector<std::vector<int32_t>>& got,
                                         std::span<const char* const> prompts, int max_tokens,
                                         const tokenizer::Tokenizer& tok, double margin_floor) {
  auto model = load_named_model("default");
  EXPECT_TRUE(model.ok()) << model.error();
  if (!model.ok()) return 0;
  CpuBackend be(2);
  int identical = 0;
  EXPECT_EQ(want.size(), prompts.size());
  EXPECT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    EXPECT_EQ(got[i].size(), static_cast<size_t>(max_tokens)) << prompts[i];
    EXPECT_EQ(want[i].size(), static_cast<size_t>(max_tokens)) << prompts[i];
    if (got[i].size() != want[i].size()) continue;
    const auto diff = std::mismatch(want[i].begin(), want[i].end(), got[i].begin());
    if (diff.first == want[i].end()) {
      ++identical;
      continue;
    }
    std::vector<int32_t> ctx = tok.encode(prompts[i]);
    ctx.insert(ctx.end(), want[i].begin(), diff.first);
    ContiguousKvCache kv(kv::kv_geometry((*model)->geometry()), 512);
    auto logits = prompt_logits(**model, kv, be, ctx);
    EXPECT_TRUE(logits.ok()) << logits.error();
    if (!logits.ok()) continue;
    std::vector<float> l = std::move(*logits);
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<>());
    EXPECT_LT(l[0] - l[1], margin_floor)
        << prompts[i] << ": the device's token differs at step " << (diff.first - want[i].begin())
        << " where the CPU's top-2 margin is " << (l[0] - l[1]);
  }
  return identical;
}

}  // namespace bie::test
