#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "bie/sampling/sampler.h"

namespace bie {
namespace {

TEST(Sampler, GreedyPicksFirstMax) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 5);
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.sample(l.data(), {}), 1);
}

TEST(Sampler, RepetitionPenaltyFollowsLlamaCppRule) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 3);
  std::vector<float> l = {4.0f, 3.0f, -1.0f};
  const std::vector<int32_t> hist = {0, 0, 2};
  EXPECT_EQ(s.sample(l.data(), hist), 1);  // 4 -> 2 < 3
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);  // negative logits are multiplied
}

TEST(Sampler, FrequencyAndPresencePenalties) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p, 3);
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> hist = {0, 0, 1};
  (void)s.sample(l.data(), hist);
  EXPECT_FLOAT_EQ(l[0], 1.0f - 2 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
}

// OpenAI's logit_bias: added to the raw logit (before the penalties), -100 bans a token in
// practice, and a bias outside [-100, 100] is refused.
TEST(Sampler, LogitBiasShiftsLogitsBeforeEverythingElse) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{1, -100.0f}, {2, 1.5f}};
  Sampler s(p, 3);
  std::vector<float> l = {1.0f, 3.0f, 0.0f};
  EXPECT_EQ(s.sample(l.data(), {}), 2);  // 1 banned; 0 + 1.5 > 1
  EXPECT_FLOAT_EQ(l[1], -97.0f);
  EXPECT_FLOAT_EQ(l[2], 1.5f);
  p.repetition_penalty = 2.0f;  // then the penalty sees the biased logit: (0 + 1.5) / 2
  Sampler s2(p, 3);
  l = {1.0f, 3.0f, 0.0f};
  const std::vector<int32_t> hist = {2};
  EXPECT_EQ(s2.sample(l.data(), hist), 0);
  EXPECT_FLOAT_EQ(l[2], 0.75f);
  EXPECT_TRUE(p.validate().ok());
  p.logit_bias = {{0, 100.5f}};
  EXPECT_NE(p.validate().error().find("logit_bias"), std::string::npos);
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(p.validate().ok());
}

TEST(Sampler, PenaltyWindowOnlySeesRecentTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 1.0f;
  p.penalty_last_n = 1;
  Sampler s(p, 2);
  std::vector<float> l = {1.0f, 1.0f};
  const std::vector<int32_t> hist = {0, 1};
  (void)s.sample(l.data(), hist);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 0.0f);
}

std::map<int32_t, int> histogram(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p, static_cast<int32_t>(logits.size()));
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    h[s.sample(l.data(), {})]++;
  }
  return h;
}

TEST(Sampler, TopKKeepsOnlyKBest) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  auto h = histogram(p, {0.0f, 1.0f, 2.0f, 0.5f}, 2000);
  EXPECT_EQ(h.count(0), 0u);
  EXPECT_EQ(h.count(3), 0u);
  // p(2)/p(1) = e: expect ~73 % / 27 %.
  EXPECT_NEAR(h[2] / 2000.0, 0.731, 0.04);
}

TEST(Sampler, TopPCutsTail) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;
  p.min_p = 0.0f;
  auto h = histogram(p, {5.0f, 0.0f, 0.0f}, 500);  // token 0 alone carries > 0.5
  EXPECT_EQ(h[0], 500);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.2f;
  // p ratio of token 1 to token 0 is e^-2 = 0.135 < 0.2: dropped. token 2 ratio e^-1 = 0.37 kept.
  auto h = histogram(p, {3.0f, 1.0f, 2.0f}, 2000);
  EXPECT_EQ(h.count(1), 0u);
  EXPECT_GT(h[2], 300);
}

TEST(Sampler, SameSeedSameOutput) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = static_cast<float>(i % 7) * 0.3f;
  Sampler a(p, 100), b(p, 100);
  for (int i = 0; i < 50; ++i) {
    auto la = logits, lb = logits;
    EXPECT_EQ(a.sample(la.data(), {}), b.sample(lb.data(), {}));
  }
}

TEST(Sampler, ValidateNamesBadField) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_NE(p.validate().error().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1.0f;
  EXPECT_FALSE(p.validate().ok());
  EXPECT_TRUE(SamplingParams{}.validate().ok());
}

}  // namespace
}  // namespace bie
