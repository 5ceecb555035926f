#include "support/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <span>

namespace bie {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status prefill(Model& model, KvCache& kv, Backend& backend, std::span<const int32_t> prompt,
               int64_t chunk, int64_t align, std::vector<float>& logits, MatmulPath path) {
  if (prompt.empty()) return Error{"the prompt is empty (it must contain at least one token)"};
  if (chunk <= 0 || align <= 0) return Error{"prefill chunk and alignment must be > 0"};
  if (!kv.can_append(static_cast<int64_t>(prompt.size()))) {
    return Error{fmt::format("prompt of {} tokens does not fit in the context of {} tokens",
                             prompt.size(), kv.capacity() - kv.n_tokens())};
  }
  for (size_t off = 0; off < prompt.size();) {
    const auto len = static_cast<size_t>(
        prefill_chunk_len(kv.n_tokens(), static_cast<int64_t>(prompt.size() - off), chunk, align));
    ForwardOptions fo;
    fo.path = path;
    auto out = model.forward(prompt.subspan(off, len), kv, backend, fo);
    if (!out) return Error{out.error()};
    off += len;
    if (off == prompt.size()) logits.assign(out->begin(), out->end());
  }
  return {};
}

Status forward_into(Model& model, std::span<const int32_t> tokens, KvCache& kv, Backend& backend,
                    std::vector<float>& logits, ForwardOptions opts) {
  auto out = model.forward(tokens, kv, backend, opts);
  if (!out) return Error{out.error()};
  logits.assign(out->begin(), out->end());
  return {};
}

int64_t prefill_chunk_len(int64_t pos, int64_t remaining, int64_t chunk, int64_t align) {
  assert(remaining > 0 && chunk > 0 && align > 0);
  int64_t len = std::min(remaining, chunk);
  if (pos % align != 0) return std::min(len, align - pos % align);
  if (len < remaining) {
    const int64_t end = (pos + len) / align * align;
    if (end > pos) len = end - pos;
  }
  return len;
}

Result<std::vector<float>> prompt_logits(Model& model, KvCache& kv, Backend& backend,
                                         const std::vector<int32_t>& prompt, int32_t prefill_chunk,
                                         int32_t prefill_align) {
  std::vector<float> logits;
  if (Status s = prefill(model, kv, backend, prompt, prefill_chunk, prefill_align, logits); !s)
    return Error{s.error()};
  return logits;
}

Result<GenerationStats> generate(Model& model, KvCache& kv, Backend& backend,
                                 const GenerateRequest& req, const TokenCallback& on_token) {
  if (Status s = req.sampling.validate(); !s) return Error{s.error()};
  if (req.max_tokens < 0) return Error{"max_tokens must be >= 0"};
  GenerationStats stats;
  stats.n_prompt = static_cast<int64_t>(req.prompt.size());
  std::vector<float> first;
  const auto t0 = std::chrono::steady_clock::now();
  if (Status s =
          prefill(model, kv, backend, req.prompt, req.prefill_chunk, req.prefill_align, first);
      !s) {
    return Error{s.error()};
  }
  std::span<float> logits(first);
  stats.prompt_seconds = seconds_since(t0);

  Sampler sampler(req.sampling, model.geometry().n_vocab);
  std::vector<int32_t> history = req.prompt;
  history.reserve(history.size() + static_cast<size_t>(req.max_tokens));
  stats.finish_reason = "length";
  const auto t1 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const int32_t tok = sampler.sample(logits.data(), history);
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end()) {
      stats.finish_reason = "stop";
      break;
    }
    history.push_back(tok);
    ++stats.n_generated;
    if (!on_token(tok)) {
      stats.finish_reason = "cancelled";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (!kv.can_append(1)) {
      stats.finish_reason = "context";
      break;
    }
    const int32_t one[1] = {tok};
    ForwardOptions fo;
    fo.path = MatmulPath::kDecode;
    auto out = model.forward(one, kv, backend, fo);
    if (!out) return Error{out.error()};
    logits = *out;
  }
  stats.decode_seconds = seconds_since(t1);
  return stats;
}

}  // namespace bie
