#include "bie/engine/quality.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>

#include "bie/engine/engine.h"
#include "bie/engine/model_path.h"
#include "bie/gguf/gguf_file.h"
#include "bie/planner/kv_bytes.h"
#include "bie/planner/kv_layer_map.h"
#include "bie/planner/model_geometry.h"
#include "bie/sampling/sampler.h"
#include "bie/tokenizer/tokenizer.h"

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
  return QualityRegime{spec, f, *layout};
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

// The logits rows of one engine step, for the regimes that run side by side, stay within this
// many bytes: the regimes run in groups of as many as fit, each group beside the baseline.
constexpr uint64_t kStepLogitsBytes = uint64_t{1} << 30;

// The first token of every scored sequence is BOS when the model asks for one (llama-perplexity
// overwrites the first token of each window the same way).
void set_bos(std::vector<int32_t>& seq, const tokenizer::Tokenizer& tok) {
  if (!seq.empty() && tok.vocab().data().add_bos && tok.bos() >= 0) seq[0] = tok.bos();
}

// The prompt-logits rows of one prompt run by several requests (the baseline first, then the
// regimes of a group), matched position by position as they arrive and handed on together as
// log-probabilities. Every request delivers the same positions, in order
// (EngineRequest::on_prompt_logits), so a request's rows wait only for the others' of the same
// positions. Called on the engine thread.
class RowMatcher {
 public:
  // fn(pos, logp): logp[i] the log-probabilities at `pos` of request i.
  using Fn = std::function<void(int64_t pos, std::span<const float* const> logp)>;
  RowMatcher(size_t n_requests, int32_t n_vocab, Fn fn)
      : queues_(n_requests), n_vocab_(n_vocab), fn_(std::move(fn)) {}

  void add(size_t i, int64_t pos, std::span<const float> logits) {
    queues_[i].push_back({pos, std::vector<float>(logits.begin(), logits.end())});
    log_softmax_inplace(queues_[i].back().logp.data(), n_vocab_);
    const auto ready = [&] {
      return std::all_of(queues_.begin(), queues_.end(), [](const auto& q) { return !q.empty(); });
    };
    while (ready()) {
      const int64_t p = queues_[0].front().pos;
      ptrs_.clear();
      for (const auto& q : queues_) {
        assert(q.front().pos == p);
        ptrs_.push_back(q.front().logp.data());
      }
      fn_(p, ptrs_);
      for (auto& q : queues_) q.pop_front();
    }
  }

 private:
  struct Row {
    int64_t pos;
    std::vector<float> logp;
  };
  std::vector<std::deque<Row>> queues_;
  int32_t n_vocab_;
  Fn fn_;
  std::vector<const float*> ptrs_;
};

// The measurement's engine: every regime is one of its KV regimes, requests run side by side.
class QualityRun {
 public:
  QualityRun(Engine& engine, const QualityConfig& cfg, std::vector<std::string> labels,
             size_t group, const QualityProgress& progress)
      : eng_(engine),
        tok_(engine.tokenizer()),
        cfg_(cfg),
        labels_(std::move(labels)),
        n_vocab_(engine.model_info().n_vocab),
        progress_(progress),
        t0_(Clock::now()) {
    // The regimes other than the baseline, in groups of `group`, each run beside the baseline.
    for (size_t r = 1; r < labels_.size(); r += group) {
      std::vector<size_t> g = {0};
      for (size_t i = r; i < std::min(labels_.size(), r + group); ++i) g.push_back(i);
      groups_.push_back(std::move(g));
    }
    if (groups_.empty()) groups_.push_back({0});
    for (size_t i = 0; i < labels_.size(); ++i) all_.push_back(i);
  }

  Status perplexity(const std::vector<int32_t>& text, size_t ci, QualityReport& rep);
  Status continuations(const std::vector<int32_t>& text, QualityReport& rep);
  Status needle(const std::vector<int32_t>& text, QualityReport& rep);

 private:
  // Runs `prompt` once in each regime of `regimes` (indices into labels_), side by side, and
  // waits for all of them: greedy, max_tokens tokens (EOS ignored). on_rows(i, pos, logits), if
  // set, receives request i's prompt logits from position `from`; out[i], if given, its tokens.
  using RowsFn = std::function<void(size_t i, int64_t pos, std::span<const float> logits)>;
  Status run_side_by_side(const std::vector<int32_t>& prompt, const std::vector<size_t>& regimes,
                          int32_t max_tokens, const RowsFn& on_rows, int64_t from,
                          std::vector<std::vector<int32_t>>* out);
  void say(const std::string& what) const {
    if (!progress_) return;
    const double s = std::chrono::duration<double>(Clock::now() - t0_).count();
    progress_(fmt::format("[{:7.1f} s] {}", s, what));
  }
  [[nodiscard]] std::string group_note(size_t gi) const {
    if (groups_.size() == 1) return {};
    return fmt::format(" (regimes {}-{} of {})", groups_[gi][1], groups_[gi].back(),
                       labels_.size() - 1);
  }

  Engine& eng_;
  const tokenizer::Tokenizer& tok_;
  const QualityConfig& cfg_;
  std::vector<std::string> labels_;  // each regime's engine regime, the baseline first
  std::vector<std::vector<size_t>> groups_;
  std::vector<size_t> all_;  // every regime, the baseline first
  int32_t n_vocab_;
  const QualityProgress& progress_;
  Clock::time_point t0_;
  RequestId next_id_ = 1;
};

Status QualityRun::run_side_by_side(const std::vector<int32_t>& prompt,
                                    const std::vector<size_t>& regimes, int32_t max_tokens,
                                    const RowsFn& on_rows, int64_t from,
                                    std::vector<std::vector<int32_t>>* out) {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  std::string error;
  if (out != nullptr) out->assign(regimes.size(), {});
  for (size_t i = 0; i < regimes.size(); ++i) {
    EngineRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0.0f;  // greedy
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.kv_cache_dtype = labels_[regimes[i]];
    if (on_rows) {
      r.on_prompt_logits = [&on_rows, i](int64_t pos, std::span<const float> logits) {
        on_rows(i, pos, logits);
      };
      r.prompt_logits_from = from;
    }
    RequestCallbacks cb;
    cb.on_token = [&, i](const TokenEvent& e) {
      if (out != nullptr) {
        std::lock_guard lk(mu);
        (*out)[i].push_back(e.token);
      }
      return true;
    };
    cb.on_finish = [&](const FinishEvent& f) {
      std::lock_guard lk(mu);
      if (f.finish_reason == "error" && error.empty()) error = f.error;
      ++done;
      cv.notify_all();
    };
    if (auto refused = eng_.submit(next_id_++, std::move(r), std::move(cb))) {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return done == i; });  // the ones already accepted still run
      return Error{fmt::format("regime {}: {}", labels_[regimes[i]], refused->message)};
    }
  }
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done == regimes.size(); });
  if (!error.empty()) return Error{error};
  return {};
}

Status QualityRun::perplexity(const std::vector<int32_t>& text, size_t ci, QualityReport& rep) {
  const int32_t n = cfg_.ctx_sizes[ci];
  const int64_t n_windows = std::min<int64_t>(cfg_.windows, static_cast<int64_t>(text.size()) / n);
  const int32_t first = n / 2;  // logits at first .. n-2 score tokens first+1 .. n-1
  for (auto& r : rep.regimes) {
    PplStats st;
    st.n_ctx = n;
    st.windows = static_cast<int32_t>(n_windows);
    r.ppl.push_back(st);
  }
  for (int64_t w = 0; w < n_windows; ++w) {
    std::vector<int32_t> win(text.begin() + w * n, text.begin() + (w + 1) * n);
    set_bos(win, tok_);
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      say(fmt::format("perplexity ctx {} window {}/{}{}", n, w + 1, n_windows, group_note(gi)));
      const std::vector<size_t>& g = groups_[gi];
      // The baseline's own figures come from the first group; every group compares with it.
      RowMatcher rows(g.size(), n_vocab_, [&](int64_t pos, std::span<const float* const> logp) {
        if (pos >= n - 1) return;  // the window's last row predicts past it
        const int32_t target = win[static_cast<size_t>(pos + 1)];
        if (gi == 0) {
          PplStats& b = rep.regimes[0].ppl[ci];
          b.nll_sum += -logp[0][target];
          ++b.n_scored;
          ++b.top1_same;
        }
        for (size_t i = 1; i < g.size(); ++i) {
          const PositionStats p = compare_logprobs(logp[0], logp[i], n_vocab_, target);
          PplStats& st = rep.regimes[g[i]].ppl[ci];
          st.nll_sum += p.nll;
          st.kld_sum += p.kld;
          st.kld_max = std::max(st.kld_max, p.kld);
          st.top1_same += p.top1_same;
          ++st.n_scored;
        }
      });
      const RowsFn on_rows = [&](size_t i, int64_t pos, std::span<const float> logits) {
        rows.add(i, pos, logits);
      };
      if (Status s = run_side_by_side(win, g, 1, on_rows, first, nullptr); !s) return s;
    }
  }
  return Status{};
}

Status QualityRun::continuations(const std::vector<int32_t>& text, QualityReport& rep) {
  const int64_t span = static_cast<int64_t>(text.size()) - cfg_.prompt_tokens;
  for (int32_t p = 0; p < cfg_.prompts; ++p) {
    say(fmt::format("greedy continuations prompt {}/{}", p + 1, cfg_.prompts));
    const int64_t start = span * p / cfg_.prompts;
    std::vector<int32_t> prompt(text.begin() + start, text.begin() + start + cfg_.prompt_tokens);
    set_bos(prompt, tok_);
    // Every regime at once: the engine runs as many side by side as it holds, queues the rest.
    std::vector<std::vector<int32_t>> out;
    if (Status s = run_side_by_side(prompt, all_, cfg_.continuation_tokens, {}, 0, &out); !s) {
      return s;
    }
    const std::vector<int32_t>& base = out[0];
    for (size_t r = 0; r < out.size(); ++r) {
      int32_t d = 0;
      while (d < static_cast<int32_t>(std::min(out[r].size(), base.size())) &&
             out[r][static_cast<size_t>(d)] == base[static_cast<size_t>(d)]) {
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
      std::vector<NeedleStats> ns(all_.size());
      for (NeedleStats& s : ns) {
        s.n_ctx = n;
        s.depth_pct = depth;
        s.needle_pos = static_cast<int32_t>(at);
        s.answer_greedy = true;
      }
      // Each regime scores its own rows: every regime at once, no matching needed.
      std::vector<float> logp(static_cast<size_t>(n_vocab_));
      const RowsFn on_rows = [&](size_t i, int64_t pos, std::span<const float> logits) {
        if (pos >= n - 1) return;  // logits at position j predict token j + 1
        const int32_t target = seq[static_cast<size_t>(pos + 1)];
        logp.assign(logits.begin(), logits.end());
        ns[i].answer_greedy = ns[i].answer_greedy && argmax(logp.data(), n_vocab_) == target;
        log_softmax_inplace(logp.data(), n_vocab_);
        ns[i].answer_logprob += logp[static_cast<size_t>(target)];
      };
      if (Status s = run_side_by_side(seq, all_, 1, on_rows, a0 - 1, nullptr); !s) return s;
      for (size_t r = 0; r < ns.size(); ++r) rep.regimes[r].needle.push_back(ns[r]);
    }
  }
  return Status{};
}

// Words no Shakespeare play contains, so the model can only answer from the planted fact.
constexpr const char* kPassphrases[] = {"zucchini",    "trampoline", "saxophone",  "bulldozer",
                                        "spreadsheet", "kangaroo",   "helicopter", "avocado"};

// The baseline: the all-FP16 cache with the default block size.
planner::KvLayoutFlags baseline_flags() {
  planner::KvLayoutFlags f;
  f.dtype = "f16";
  return f;
}

}  // namespace

Result<QualityReport> measure_kv_quality(const QualityTarget& target, const std::string& text,
                                         const QualityConfig& cfg,
                                         const QualityProgress& progress) {
  if (cfg.batch < 1) return Error{"batch must be at least 1 token"};
  for (const QualityRegime& r : cfg.regimes) {
    // Per-channel keys are written a whole block at a time; chunks that end inside a block would
    // need FP16 blocks beyond the planned pools (docs/kv-cache.md §8).
    if (cfg.batch % r.layout.block_size != 0) {
      return Error{fmt::format("batch ({}) must be a multiple of the KV block size ({})", cfg.batch,
                               r.layout.block_size)};
    }
  }
  for (int32_t n : cfg.ctx_sizes) {
    if (n < 4) return Error{fmt::format("context size {} is too small (at least 4 tokens)", n)};
  }
  if (cfg.prompts > 0 && (cfg.prompt_tokens < 1 || cfg.continuation_tokens < 1)) {
    return Error{"prompts and continuations need at least one token each"};
  }
  for (int32_t d : cfg.needle_depths) {
    if (d < 0 || d > 100) return Error{fmt::format("needle depth {}% is not in 0..100", d)};
  }
  for (int32_t n : cfg.needle_ctx) {
    if (n < 64) return Error{fmt::format("needle context {} is too small (at least 64 tokens)", n)};
  }
  // The file's shape and tokenizer first: the text is checked before the engine loads.
  auto path = resolve_model_path(target.model);
  if (!path) return Error{path.error()};
  auto file = gguf::GgufFile::open(*path);
  if (!file) return Error{file.error()};
  auto geometry = planner::geometry_from_gguf(**file);
  if (!geometry) return Error{geometry.error()};
  const planner::ModelGeometry& geom = *geometry;
  auto tokenizer = tokenizer::Tokenizer::from_gguf(**file);
  if (!tokenizer) return Error{tokenizer.error()};
  const tokenizer::Tokenizer& tok = *tokenizer;
  tokenizer::EncodeOptions raw;
  raw.add_special = false;
  const std::vector<int32_t> tokens = tok.encode(text, raw);
  const int64_t n_text = static_cast<int64_t>(tokens.size());
  for (int32_t n : cfg.ctx_sizes) {
    if (n_text < n) {
      return Error{fmt::format(
          "the text has {} tokens, too few for one perplexity window of {} tokens", n_text, n)};
    }
  }
  if (cfg.prompts > 0 && n_text < cfg.prompt_tokens) {
    return Error{fmt::format("the text has {} tokens, too few for a prompt of {} tokens", n_text,
                             cfg.prompt_tokens)};
  }
  for (int32_t n : cfg.needle_ctx) {
    if (n > n_text) {
      return Error{fmt::format("the text has {} tokens, too few for a needle haystack of {} tokens",
                               n_text, n)};
    }
  }

  QualityReport rep;
  rep.text_tokens = n_text;
  rep.passphrase = kPassphrases[cfg.seed % std::size(kPassphrases)];
  const planner::KvLayoutFlags base_flags = baseline_flags();
  auto base_layout = planner::resolve_kv_layout(base_flags);
  if (!base_layout) return Error{base_layout.error()};
  rep.regimes.push_back({QualityRegime{"f16", base_flags, *base_layout}, {}, {}, {}, 0, {}});
  for (const auto& r : cfg.regimes) {
    // The baseline runs once. Other spellings of f16 ("k=f16:v=f16") run as regimes of their
    // own, which checks the comparison itself: they must match the baseline exactly.
    if (r.spec == "f16") continue;
    rep.regimes.push_back({r, {}, {}, {}, 0, {}});
  }
  for (auto& r : rep.regimes) {
    if (Status s = planner::check_kv_layout(geom, r.regime.layout); !s) {
      return Error{fmt::format("regime '{}': {}", r.regime.spec, s.error())};
    }
    r.body_bytes_per_token = planner::kv_bytes_per_token(geom, r.regime.layout);
    for (int32_t n : cfg.ctx_sizes) {
      r.bytes_per_token.push_back(
          static_cast<double>(planner::kv_sequence_bytes(geom, r.regime.layout, n)) / n);
    }
  }

  // Tokens per chunk: every regime takes the smallest regime's chunk, so the regimes advance in
  // lock step (an f16 cache's logits do not depend on the chunking). Groups of regimes run side
  // by side within kStepLogitsBytes of logits per step.
  int64_t step = cfg.batch;
  for (const auto& r : rep.regimes) step = std::min(step, r.regime.layout.prefill_chunk(cfg.batch));
  const uint64_t row_bytes = static_cast<uint64_t>(geom.n_vocab) * sizeof(float);
  const auto side_by_side = static_cast<size_t>(
      std::clamp<uint64_t>(kStepLogitsBytes / (static_cast<uint64_t>(step) * row_bytes), 2,
                           std::max<size_t>(rep.regimes.size(), 2)));
  int64_t longest = 0;
  for (int32_t n : cfg.ctx_sizes) longest = std::max<int64_t>(longest, n);
  for (int32_t n : cfg.needle_ctx) longest = std::max<int64_t>(longest, n);
  if (cfg.prompts > 0) longest = std::max<int64_t>(longest, cfg.prompt_tokens + cfg.continuation_tokens);

  EngineConfig ec;
  ec.model = *path;
  ec.device = target.device;
  ec.threads = target.threads;
  ec.kv.kv = base_flags;
  ec.kv.max_model_len = longest + 1;  // a window's last row comes with one generated token
  ec.kv.max_num_seqs = static_cast<int64_t>(side_by_side);
  ec.kv.chunked_prefill_size = step;
  ec.max_num_batched_tokens = step * static_cast<int64_t>(side_by_side);
  ec.max_queue = static_cast<int64_t>(rep.regimes.size()) + 1;
  ec.enable_prefix_caching = false;
  ec.prompt_logits = true;
  ec.f16_kill_switch = false;
  ec.check_integrity = true;
  std::vector<std::string> labels = {planner::kv_layout_label(*base_layout)};
  for (size_t r = 1; r < rep.regimes.size(); ++r) {
    ec.kv_regime_layouts.push_back(rep.regimes[r].regime.flags);
    labels.push_back(planner::kv_layout_label(rep.regimes[r].regime.layout));
  }
  if (progress) {
    progress(fmt::format("{} regimes beside f16, {} at a time, {}-token chunks",
                         rep.regimes.size() - 1, side_by_side - 1, step));
  }
  auto engine = Engine::create(ec);
  if (!engine) return Error{engine.error()};

  QualityRun run(**engine, cfg, std::move(labels), side_by_side - 1, progress);
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
