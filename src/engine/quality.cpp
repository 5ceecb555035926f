#include "bie/engine/quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "bie/backend/thread_pool.h"
#include "bie/engine/generate.h"
#include "bie/engine/kv_setup.h"
#include "bie/kv/paged_kv_cache.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layer_map.h"
#include "bie/planner/model_geometry.h"
#include "bie/sampling/sampler.h"

namespace bie {

// ---- regimes ------------------------------------------------------------------------------

Result<QualityRegime> parse_quality_regime(const std::string& spec,
                                           const planner::KvLayoutFlags& base) {
  planner::KvLayoutFlags f = base;
  f.dtype_k.clear();
  f.dtype_v.clear();
  f.rotate.reset();
  std::string body = spec;
  const auto ends_with = [&](const std::string& suffix) {
    return body.size() > suffix.size() &&
           body.compare(body.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("+rotate")) {
    f.rotate = true;
    body.resize(body.size() - 7);
  } else if (ends_with("-rotate")) {
    f.rotate = false;
    body.resize(body.size() - 7);
  }
  if (body.empty()) return Error{fmt::format("regime '{}': no KV type named", spec)};
  if (body.rfind("map=", 0) == 0) {  // a --kv-layer-map file
    auto map = planner::read_kv_layer_map(body.substr(4));
    if (!map) return Error{fmt::format("regime '{}': {}", spec, map.error())};
    f.layer_map = *map;
  } else if (body.find('=') == std::string::npos) {
    f.dtype = body;
  } else {
    // "k=NAME:v=NAME": the side left out stays f16.
    f.dtype = "f16";
    size_t at = 0;
    while (at <= body.size()) {
      const size_t end = std::min(body.find(':', at), body.size());
      const std::string part = body.substr(at, end - at);
      if (part.rfind("k=", 0) == 0) {
        f.dtype_k = part.substr(2);
      } else if (part.rfind("v=", 0) == 0) {
        f.dtype_v = part.substr(2);
      } else {
        return Error{fmt::format(
            "regime '{}': expected k=NAME and/or v=NAME separated by ':', got '{}'", spec, part)};
      }
      at = end + 1;
    }
  }
  auto layout = planner::resolve_kv_layout(f);
  if (!layout) return Error{fmt::format("regime '{}': {}", spec, layout.error())};
  return QualityRegime{spec, *layout};
}

// ---- per-position statistics --------------------------------------------------------------

PositionStats compare_logprobs(const float* base_logp, const float* test_logp, int32_t n_vocab,
                               int32_t target) {
  PositionStats s;
  double kld = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    const double lb = base_logp[i];
    kld += std::exp(lb) * (lb - static_cast<double>(test_logp[i]));
  }
  s.kld = std::max(kld, 0.0);  // rounding can leave a tiny negative sum for identical rows
  s.top1_same = argmax(base_logp, n_vocab) == argmax(test_logp, n_vocab);
  s.nll = -static_cast<double>(test_logp[target]);
  return s;
}

double PplStats::ppl() const {
  return n_scored ? std::exp(nll_sum / static_cast<double>(n_scored)) : 0.0;
}

double RegimeQuality::median_divergence() const {
  if (first_divergence.empty()) return 0.0;
  std::vector<int32_t> v = first_divergence;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double QualityReport::delta_ppl_pct(size_t r, size_t i) const {
  const double base = regimes[0].ppl[i].ppl();
  return base > 0 ? 100.0 * (regimes[r].ppl[i].ppl() / base - 1.0) : 0.0;
}

namespace {

using Clock = std::chrono::steady_clock;

// A cache for one sequence of max_tokens, with pools planned for exactly that, appended in passes
// of up to `batch` tokens (chunked prefill fits them: PagedKvCache::append migrates window exits
// between blocks; local layer groups get the pass headroom).
// On a backend that holds paged KV (a GPU) the pools live in its memory.
Result<std::unique_ptr<PagedKvCache>> make_cache(const Model& model,
                                                 const planner::ModelGeometry& g,
                                                 const planner::KvLayout& layout,
                                                 int64_t max_tokens, int32_t batch,
                                                 Backend& backend) {
  PagedKvCacheConfig c;
  c.geometry = kv::kv_geometry(model.geometry());
  c.layout = layout;
  c.max_tokens = max_tokens;
  c.max_append = batch;
  if (backend.supports_paged_kv()) c.device = &backend;
  return PagedKvCache::create(c, planner::kv_pool_plan(g, layout, max_tokens, 1, batch).groups);
}

// The first token of every scored sequence is BOS when the model asks for one (llama-perplexity
// overwrites the first token of each window the same way).
void set_bos(std::vector<int32_t>& seq, const tokenizer::Tokenizer& tok) {
  if (!seq.empty() && tok.vocab().data().add_bos && tok.bos() >= 0) seq[0] = tok.bos();
}

class QualityRun {
 public:
  QualityRun(Model& model, const planner::ModelGeometry& geom, const tokenizer::Tokenizer& tok,
             const QualityConfig& cfg, Backend& backend, const QualityProgress& progress)
      : model_(model),
        geom_(geom),
        tok_(tok),
        cfg_(cfg),
        backend_(backend),
        pool_(backend.host_threads()),
        progress_(progress),
        n_vocab_(model.geometry().n_vocab),
        t0_(Clock::now()) {}

  Status perplexity(const std::vector<int32_t>& text, size_t ci, QualityReport& rep);
  Status continuations(const std::vector<int32_t>& text, QualityReport& rep);
  Status needle(const std::vector<int32_t>& text, QualityReport& rep);

 private:
  // Tokens per forward for a cache of this layout, as the engine chunks a prompt.
  [[nodiscard]] int32_t chunk_for(const planner::KvLayout& layout) const {
    return static_cast<int32_t>(layout.prefill_chunk(cfg_.batch));
  }
  void say(const std::string& what) const {
    if (!progress_) return;
    const double s = std::chrono::duration<double>(Clock::now() - t0_).count();
    progress_(fmt::format("[{:7.1f} s] {}", s, what));
  }
  Model& model_;
  const planner::ModelGeometry& geom_;
  const tokenizer::Tokenizer& tok_;
  const QualityConfig& cfg_;
  Backend& backend_;
  ThreadPool& pool_;  // the backend's host threads
  const QualityProgress& progress_;
  int32_t n_vocab_;
  Clock::time_point t0_;
  std::vector<float> base_;  // [batch, n_vocab] baseline log-probabilities of one chunk
  std::vector<float> test_;  // [batch, n_vocab] a regime's logits of the same chunk
};

Status QualityRun::perplexity(const std::vector<int32_t>& text, size_t ci, QualityReport& rep) {
  const int32_t n = cfg_.ctx_sizes[ci];
  const int64_t n_windows = std::min<int64_t>(cfg_.windows, static_cast<int64_t>(text.size()) / n);
  const int32_t first = n / 2;  // logits at first .. n-2 score tokens first+1 .. n-1
  const size_t n_reg = rep.regimes.size();
  for (auto& r : rep.regimes) {
    PplStats st;
    st.n_ctx = n;
    st.windows = static_cast<int32_t>(n_windows);
    r.ppl.push_back(st);
  }
  std::vector<PositionStats> rows(static_cast<size_t>(cfg_.batch));
  // The regimes run in lock step, chunk by chunk: every one takes the smallest regime's chunk (an
  // f16 cache's logits do not depend on the chunking).
  int32_t step = cfg_.batch;
  for (const auto& r : rep.regimes) step = std::min(step, chunk_for(r.regime.layout));
  for (int64_t w = 0; w < n_windows; ++w) {
    say(fmt::format("perplexity ctx {} window {}/{}", n, w + 1, n_windows));
    std::vector<int32_t> win(text.begin() + w * n, text.begin() + (w + 1) * n);
    set_bos(win, tok_);
    std::vector<std::unique_ptr<PagedKvCache>> kv;
    for (const auto& r : rep.regimes) {
      auto c = make_cache(model_, geom_, r.regime.layout, n, cfg_.batch, backend_);
      if (!c) return Error{c.error()};
      kv.push_back(std::move(c).value());
    }
    for (int32_t c0 = 0; c0 < n; c0 += step) {
      const int32_t len = std::min(step, n - c0);
      if (c0 > 0 && n > 2048) say(fmt::format("  ... {} of {} tokens", c0, n));
      const std::span<const int32_t> chunk(win.data() + c0, static_cast<size_t>(len));
      ForwardOptions fo;
      fo.logits_all = c0 + len > first;
      // Rows of this chunk that score a token: positions j in [first, n-1).
      const int32_t j0 = std::max(c0, first), j1 = std::min(c0 + len, n - 1);
      if (Status s = forward_into(model_, chunk, *kv[0], backend_, base_, fo); !s) return s;
      if (!fo.logits_all) {
        for (size_t r = 1; r < n_reg; ++r) {
          if (Status s = forward_into(model_, chunk, *kv[r], backend_, test_, fo); !s) return s;
        }
        continue;
      }
      pool_.parallel_for(j1 - j0, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          float* row = base_.data() + (j0 - c0 + i) * static_cast<int64_t>(n_vocab_);
          log_softmax_inplace(row, n_vocab_);
          rows[static_cast<size_t>(i)].nll = -row[win[static_cast<size_t>(j0 + i + 1)]];
        }
      });
      PplStats& b = rep.regimes[0].ppl[ci];
      for (int32_t i = 0; i < j1 - j0; ++i) b.nll_sum += rows[static_cast<size_t>(i)].nll;
      b.n_scored += j1 - j0;
      b.top1_same += j1 - j0;
      for (size_t r = 1; r < n_reg; ++r) {
        if (Status s = forward_into(model_, chunk, *kv[r], backend_, test_, fo); !s) return s;
        pool_.parallel_for(j1 - j0, [&](int64_t bgn, int64_t e, int) {
          for (int64_t i = bgn; i < e; ++i) {
            const int64_t off = (j0 - c0 + i) * static_cast<int64_t>(n_vocab_);
            log_softmax_inplace(test_.data() + off, n_vocab_);
            rows[static_cast<size_t>(i)] =
                compare_logprobs(base_.data() + off, test_.data() + off, n_vocab_,
                                 win[static_cast<size_t>(j0 + i + 1)]);
          }
        });
        PplStats& st = rep.regimes[r].ppl[ci];
        for (int32_t i = 0; i < j1 - j0; ++i) {
          const PositionStats& p = rows[static_cast<size_t>(i)];
          st.nll_sum += p.nll;
          st.kld_sum += p.kld;
          st.kld_max = std::max(st.kld_max, p.kld);
          st.top1_same += p.top1_same;
        }
        st.n_scored += j1 - j0;
      }
    }
    for (size_t r = 0; r < n_reg; ++r) {
      if (Status s = kv[r]->check_integrity(); !s) return s;
    }
  }
  return Status{};
}

Status QualityRun::continuations(const std::vector<int32_t>& text, QualityReport& rep) {
  const int64_t span = static_cast<int64_t>(text.size()) - cfg_.prompt_tokens;
  GenerateRequest req;
  req.sampling.temperature = 0.0f;  // greedy
  req.max_tokens = cfg_.continuation_tokens;
  const int64_t max_tokens = cfg_.prompt_tokens + cfg_.continuation_tokens;
  for (int32_t p = 0; p < cfg_.prompts; ++p) {
    say(fmt::format("greedy continuations prompt {}/{}", p + 1, cfg_.prompts));
    const int64_t start = span * p / cfg_.prompts;
    req.prompt.assign(text.begin() + start, text.begin() + start + cfg_.prompt_tokens);
    set_bos(req.prompt, tok_);
    std::vector<int32_t> base;
    for (size_t r = 0; r < rep.regimes.size(); ++r) {
      auto kv =
          make_cache(model_, geom_, rep.regimes[r].regime.layout, max_tokens, cfg_.batch, backend_);
      if (!kv) return Error{kv.error()};
      req.prefill_chunk = chunk_for(rep.regimes[r].regime.layout);
      std::vector<int32_t> out;
      auto st = generate(model_, **kv, backend_, req, [&](int32_t id) {
        out.push_back(id);
        return true;
      });
      if (!st) return Error{st.error()};
      if (r == 0) base = out;
      int32_t d = 0;
      while (d < static_cast<int32_t>(std::min(out.size(), base.size())) &&
             out[static_cast<size_t>(d)] == base[static_cast<size_t>(d)]) {
        ++d;
      }
      rep.regimes[r].first_divergence.push_back(d);
    }
  }
  return Status{};
}

Status QualityRun::needle(const std::vector<int32_t>& text, QualityReport& rep) {
  tokenizer::EncodeOptions raw;
  raw.add_special = false;
  const auto fact = tok_.encode("The secret passphrase is " + rep.passphrase + ".\n", raw);
  const auto question = tok_.encode(
      "\nQuestion: What is the secret passphrase?\nAnswer: The secret passphrase is", raw);
  const auto answer = tok_.encode(" " + rep.passphrase, raw);
  for (int32_t n : cfg_.needle_ctx) {
    const int64_t hay = n - static_cast<int64_t>(fact.size() + question.size() + answer.size());
    for (int32_t depth : cfg_.needle_depths) {
      // Plant the fact at the start of the first line at or after depth% of the haystack.
      int64_t at = hay * depth / 100;
      while (at > 0 && at < hay) {
        const std::string_view piece = tok_.token_to_piece(text[static_cast<size_t>(at - 1)]);
        if (!piece.empty() && piece.back() == '\n') break;
        ++at;
      }
      std::vector<int32_t> seq(text.begin(), text.begin() + at);
      seq.insert(seq.end(), fact.begin(), fact.end());
      seq.insert(seq.end(), text.begin() + at, text.begin() + hay);
      seq.insert(seq.end(), question.begin(), question.end());
      seq.insert(seq.end(), answer.begin(), answer.end());
      set_bos(seq, tok_);
      const int64_t a0 = static_cast<int64_t>(seq.size() - answer.size());  // first answer token
      say(fmt::format("needle ctx {} depth {}%", n, depth));
      for (auto& r : rep.regimes) {
        auto kv = make_cache(model_, geom_, r.regime.layout, n, cfg_.batch, backend_);
        if (!kv) return Error{kv.error()};
        NeedleStats ns;
        ns.n_ctx = n;
        ns.depth_pct = depth;
        ns.needle_pos = static_cast<int32_t>(at);
        ns.answer_greedy = true;
        const int32_t step = chunk_for(r.regime.layout);
        for (int64_t c0 = 0; c0 < n; c0 += step) {
          const int64_t len = std::min<int64_t>(step, n - c0);
          ForwardOptions fo;
          fo.logits_all = c0 + len > a0 - 1;
          const std::span<const int32_t> chunk(seq.data() + c0, static_cast<size_t>(len));
          if (Status s = forward_into(model_, chunk, **kv, backend_, test_, fo); !s) return s;
          if (!fo.logits_all) continue;
          // Logits at position j predict token j + 1: rows a0-1 .. n-2 score the answer.
          for (int64_t j = std::max(c0, a0 - 1); j < std::min(c0 + len, int64_t{n} - 1); ++j) {
            float* row = test_.data() + (j - c0) * n_vocab_;
            const int32_t target = seq[static_cast<size_t>(j + 1)];
            ns.answer_greedy = ns.answer_greedy && argmax(row, n_vocab_) == target;
            log_softmax_inplace(row, n_vocab_);
            ns.answer_logprob += row[target];
          }
        }
        r.needle.push_back(ns);
      }
    }
  }
  return Status{};
}

// Words no Shakespeare play contains, so the model can only answer from the planted fact.
constexpr const char* kPassphrases[] = {"zucchini",    "trampoline", "saxophone",  "bulldozer",
                                        "spreadsheet", "kangaroo",   "helicopter", "avocado"};

}  // namespace

Result<QualityReport> measure_kv_quality(Model& model, const tokenizer::Tokenizer& tok,
                                         const std::string& text, const QualityConfig& cfg,
                                         Backend& backend, const QualityProgress& progress) {
  if (cfg.batch < 1) return Error{"batch must be at least 1 token"};
  for (const QualityRegime& r : cfg.regimes) {
    // Per-channel keys are written a whole block at a time; chunks that end inside a block would
    // need FP16 blocks beyond the planned pools (docs/kv-cache.md §8).
    if (cfg.batch % r.layout.block_size != 0) {
      return Error{fmt::format("batch ({}) must be a multiple of the KV block size ({})", cfg.batch,
                               r.layout.block_size)};
    }
  }
  tokenizer::EncodeOptions raw;
  raw.add_special = false;
  const std::vector<int32_t> tokens = tok.encode(text, raw);
  const int64_t n_text = static_cast<int64_t>(tokens.size());
  for (int32_t n : cfg.ctx_sizes) {
    if (n < 4) return Error{fmt::format("context size {} is too small (at least 4 tokens)", n)};
    if (n_text < n) {
      return Error{fmt::format(
          "the text has {} tokens, too few for one perplexity window of {} tokens", n_text, n)};
    }
  }
  if (cfg.prompts > 0 && n_text < cfg.prompt_tokens) {
    return Error{fmt::format("the text has {} tokens, too few for a prompt of {} tokens", n_text,
                             cfg.prompt_tokens)};
  }
  if (cfg.prompts > 0 && (cfg.prompt_tokens < 1 || cfg.continuation_tokens < 1)) {
    return Error{"prompts and continuations need at least one token each"};
  }
  for (int32_t d : cfg.needle_depths) {
    if (d < 0 || d > 100) return Error{fmt::format("needle depth {}% is not in 0..100", d)};
  }

  QualityReport rep;
  rep.text_tokens = n_text;
  rep.passphrase = kPassphrases[cfg.seed % std::size(kPassphrases)];
  for (int32_t n : cfg.needle_ctx) {
    if (n > n_text) {
      return Error{fmt::format("the text has {} tokens, too few for a needle haystack of {} tokens",
                               n_text, n)};
    }
    if (n < 64) return Error{fmt::format("needle context {} is too small (at least 64 tokens)", n)};
  }

  const planner::ModelGeometry* geom = &model.geometry();
  QualityRegime base;
  base.spec = "f16";
  rep.regimes.push_back({base, {}, {}, {}, 0, {}});
  for (const auto& r : cfg.regimes) {
    // The baseline runs once. Other spellings of f16 ("k=f16:v=f16") run as regimes of their
    // own, which checks the comparison itself: they must match the baseline exactly.
    if (r.spec == "f16") continue;
    rep.regimes.push_back({r, {}, {}, {}, 0, {}});
  }
  for (auto& r : rep.regimes) {
    if (Status s = planner::check_kv_layout(*geom, r.regime.layout); !s) {
      return Error{fmt::format("regime '{}': {}", r.regime.spec, s.error())};
    }
    r.body_bytes_per_token = planner::kv_bytes_per_token(*geom, r.regime.layout);
    for (int32_t n : cfg.ctx_sizes) {
      r.bytes_per_token.push_back(
          static_cast<double>(planner::kv_sequence_bytes(*geom, r.regime.layout, n)) / n);
    }
  }

  QualityRun run(model, *geom, tok, cfg, backend, progress);
  // llama-perplexity tokenizes with add_special: a model that wants BOS gets one in front of the
  // text, then the first token of every window is overwritten with BOS (set_bos). The same
  // windows here, so the two engines score the same tokens figure for figure.
  std::vector<int32_t> ppl_tokens;
  const bool bos_first = tok.vocab().data().add_bos && tok.bos() >= 0;
  if (bos_first) {
    ppl_tokens.reserve(tokens.size() + 1);
    ppl_tokens.push_back(tok.bos());
    ppl_tokens.insert(ppl_tokens.end(), tokens.begin(), tokens.end());
  }
  for (size_t ci = 0; ci < cfg.ctx_sizes.size(); ++ci) {
    if (Status s = run.perplexity(bos_first ? ppl_tokens : tokens, ci, rep); !s) {
      return Error{s.error()};
    }
  }
  if (cfg.prompts > 0) {
    if (Status s = run.continuations(tokens, rep); !s) return Error{s.error()};
  }
  if (Status s = run.needle(tokens, rep); !s) return Error{s.error()};
  return rep;
}

}  // namespace bie
