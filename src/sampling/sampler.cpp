#include "bie/sampling/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace bie {

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return Error{fmt::format("temperature must be >= 0, got {}", temperature)};
  }
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return Error{fmt::format("top_p must be in (0, 1], got {}", top_p)};
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return Error{fmt::format("min_p must be in [0, 1], got {}", min_p)};
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return Error{fmt::format("repetition_penalty must be > 0, got {}", repetition_penalty)};
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return Error{fmt::format("logit_bias: token id {} is negative", id)};
    if (!std::isfinite(bias) || std::fabs(bias) > 100.0f) {
      return Error{fmt::format("logit_bias of token {} must be in [-100, 100], got {}", id, bias)};
    }
  }
  if (!std::isfinite(presence_penalty) || std::fabs(presence_penalty) > 2.0f) {
    return Error{fmt::format("presence_penalty must be in [-2, 2], got {}", presence_penalty)};
  }
  if (!std::isfinite(frequency_penalty) || std::fabs(frequency_penalty) > 2.0f) {
    return Error{fmt::format("frequency_penalty must be in [-2, 2], got {}", frequency_penalty)};
  }
  if (penalty_last_n < -1)
    return Error{fmt::format("penalty_last_n must be >= -1, got {}", penalty_last_n)};
  return {};
}

void log_softmax_inplace(float* row, int32_t n_vocab) {
  float mx = row[0];
  for (int32_t i = 1; i < n_vocab; ++i) mx = std::max(mx, row[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
  const float log_z = mx + static_cast<float>(std::log(sum));
  for (int32_t i = 0; i < n_vocab; ++i) row[i] -= log_z;
}

int32_t argmax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {}

void Sampler::apply_penalties(float* logits, std::span<const int32_t> history) {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < n_vocab_) logits[id] += bias;  // -100 / +100: as good as banned / forced
  }
  const bool any = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                   params_.frequency_penalty != 0.0f;
  if (!any || history.empty() || params_.penalty_last_n == 0) return;
  size_t window = history.size();
  if (params_.penalty_last_n > 0)
    window = std::min(window, static_cast<size_t>(params_.penalty_last_n));
  const auto recent = history.subspan(history.size() - window);
  counts_.assign(static_cast<size_t>(n_vocab_), 0);
  for (int32_t t : recent) {
    if (t >= 0 && t < n_vocab_) counts_[static_cast<size_t>(t)]++;
  }
  for (int32_t t : recent) {
    if (t < 0 || t >= n_vocab_) continue;
    int32_t& c = counts_[static_cast<size_t>(t)];
    if (c == 0) continue;  // already applied for this id
    float& l = logits[t];
    // llama.cpp: divide positive logits, multiply negative ones, so the penalty always lowers.
    l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    l -= static_cast<float>(c) * params_.frequency_penalty + params_.presence_penalty;
    c = 0;
  }
}

const std::vector<TokenProb>& Sampler::distribution(float* logits,
                                                    std::span<const int32_t> history) {
  apply_penalties(logits, history);
  return shaped(logits);
}

const std::vector<TokenProb>& Sampler::shaped(const float* logits) {
  dist_.clear();
  if (params_.temperature <= 0.0f) {
    dist_.push_back({argmax(logits, n_vocab_), 1.0});
    return dist_;
  }
  candidates_.resize(static_cast<size_t>(n_vocab_));
  for (int32_t i = 0; i < n_vocab_; ++i) candidates_[static_cast<size_t>(i)] = {i, logits[i]};
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  size_t n = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(n),
                      candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(n);
  // Softmax over the survivors (before temperature, as llama.cpp's top-p and min-p see it).
  auto probabilities = [&](float temp) {
    std::vector<double> p(candidates_.size());
    const double max_l = candidates_.front().logit;
    double sum = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      p[i] = std::exp((candidates_[i].logit - max_l) / temp);
      sum += p[i];
    }
    for (double& x : p) x /= sum;
    return p;
  };
  if (params_.top_p < 1.0f) {
    const auto p = probabilities(1.0f);
    double cum = 0.0;
    size_t keep = p.size();
    for (size_t i = 0; i < p.size(); ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    candidates_.resize(keep);
  }
  if (params_.min_p > 0.0f) {
    // Keep tokens whose probability is at least min_p times the top one: logit >= max + ln(min_p).
    const float threshold = candidates_.front().logit + std::log(params_.min_p);
    size_t keep = 1;
    while (keep < candidates_.size() && candidates_[keep].logit >= threshold) ++keep;
    candidates_.resize(keep);
  }
  const auto p = probabilities(params_.temperature);
  dist_.resize(p.size());
  for (size_t i = 0; i < p.size(); ++i) dist_[i] = {candidates_[i].id, p[i]};
  return dist_;
}

int32_t Sampler::draw(const std::vector<TokenProb>& dist) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  double total = 0.0;
  for (const TokenProb& t : dist) total += t.p;
  const double r = uniform(rng_) * total;
  double cum = 0.0;
  for (const TokenProb& t : dist) {
    cum += t.p;
    if (r < cum) return t.id;
  }
  return dist.back().id;
}

int32_t Sampler::pick(const float* logits) {
  if (params_.temperature <= 0.0f) return argmax(logits, n_vocab_);
  return draw(shaped(logits));
}

int32_t Sampler::sample(float* logits, std::span<const int32_t> history,
                        TokenConstraint* constraint) {
  apply_penalties(logits, history);
  const int32_t first = pick(logits);
  if (constraint == nullptr || constraint->allows(first)) return first;
  constraint->mask_logits(logits, n_vocab_);
  const int32_t best = argmax(logits, n_vocab_);
  if (logits[best] == -std::numeric_limits<float>::infinity()) return kNoConstrainedToken;
  return pick(logits);
}

DraftVerdict Sampler::verify(float* logits, std::span<const int32_t> history, int32_t draft,
                             const std::vector<TokenProb>* q, TokenConstraint* constraint) {
  if (constraint != nullptr) {
    if (params_.temperature <= 0.0f) {
      const int32_t t = sample(logits, history, constraint);
      return {t == draft && t != kNoConstrainedToken, t};
    }
    constraint->mask_logits(logits, n_vocab_);
    if (logits[argmax(logits, n_vocab_)] == -std::numeric_limits<float>::infinity()) {
      return {false, kNoConstrainedToken};
    }
  }
  const std::vector<TokenProb>& p = distribution(logits, history);
  if (params_.temperature <= 0.0f) return {p.front().id == draft, p.front().id};
  const auto prob_in = [](const std::vector<TokenProb>& d, int32_t id) {
    for (const TokenProb& t : d) {
      if (t.id == id) return t.p;
    }
    return 0.0;
  };
  const double pd = prob_in(p, draft);
  const double qd = q != nullptr ? prob_in(*q, draft) : 1.0;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  if (qd > 0.0 && uniform(rng_) < std::min(1.0, pd / qd)) return {true, draft};
  // Rejected: draw from the part of p that q does not cover.
  residual_.clear();
  for (const TokenProb& t : p) {
    const double r = t.p - (q != nullptr ? prob_in(*q, t.id) : (t.id == draft ? 1.0 : 0.0));
    if (r > 0.0) residual_.push_back({t.id, r});
  }
  if (residual_.empty()) return {false, p.front().id};  // p == q up to rounding
  return {false, draw(residual_)};
}

}  // namespace bie
