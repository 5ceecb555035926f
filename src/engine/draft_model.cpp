#include "bie/engine/draft_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "bie/kv/sequence_kv.h"
#include "bie/planner/planner.h"
#include "bie/tokenizer/tokenizer.h"

namespace bie {

Status check_same_vocab(const tokenizer::Vocab& target, const tokenizer::Vocab& draft) {
  if (draft.n_tokens() != target.n_tokens()) {
    return Error{fmt::format("its vocabulary has {} tokens, the target's {}", draft.n_tokens(),
                             target.n_tokens())};
  }
  if (draft.kind() != target.kind()) {
    return Error{"its tokenizer model differs from the target's"};
  }
  for (int32_t id = 0; id < target.n_tokens(); ++id) {
    if (draft.text(id) != target.text(id)) {
      return Error{fmt::format("token {} is '{}' in the draft and '{}' in the target", id,
                               draft.text(id), target.text(id))};
    }
  }
  const tokenizer::SpecialIds& a = target.ids();
  const tokenizer::SpecialIds& b = draft.ids();
  if (a.bos != b.bos || a.eos != b.eos || a.eot != b.eot) {
    return Error{
        fmt::format("special tokens differ (bos/eos/eot {}/{}/{} vs the target's {}/{}/{})", b.bos,
                    b.eos, b.eot, a.bos, a.eos, a.eot)};
  }
  return {};
}

Result<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::create(
    const std::string& path, const tokenizer::Vocab& target_vocab, int64_t kv_tokens, int32_t chunk,
    Backend& backend, int32_t draft_vocab) {
  const auto fail = [&](const std::string& why) {
    return Error{fmt::format("--speculative-model {}: {}", path, why)};
  };
  if (kv_tokens < 1 || chunk < 1) return fail("needs a KV cache of at least one token");
  LoadOptions lo;
  lo.max_batch_tokens = chunk;
  lo.logits_vocab = draft_vocab;
  auto model = load_model(path, lo);
  if (!model) return fail(model.error());
  auto tok = tokenizer::Tokenizer::from_gguf((*model)->file());
  if (!tok) return fail(tok.error());
  if (Status s = check_same_vocab(target_vocab, tok->vocab()); !s) {
    return fail("not usable as a draft: " + s.error());
  }
  if ((*model)->geometry().n_vocab != target_vocab.n_tokens()) {
    return fail(fmt::format("its output has {} logits, the vocabulary {} tokens",
                            (*model)->geometry().n_vocab, target_vocab.n_tokens()));
  }
  const planner::ModelGeometry* g = &(*model)->geometry();
  // Unmixed FP16: drafts are rolled back anywhere, and the copy is a cache, not the answer.
  const planner::KvLayout layout;
  // A draft model with sliding-window layers holds a chunk beyond its local windows while it reads.
  auto sc =
      PagedKvStore::planned_config(kv::kv_geometry((*model)->geometry()), layout, kv_tokens, 1, chunk);
  if (!sc) return fail(sc.error());
  sc->model_id = "draft:" + path;
  sc->enable_prefix_caching = false;
  sc->backend = &backend;  // the draft's KV beside the target's
  auto store = PagedKvStore::create(*sc);
  if (!store) return fail(store.error());
  // The draft's weights and workspace are held from start-up, as the target's are (on the CPU
  // its weights are repacked here, not inside the first speculative request).
  if (Status st = (*model)->bind(backend); !st) return fail(st.error());
  DraftModelBytes bytes;
  bytes.weights = (*model)->weight_bytes();
  bytes.workspace = planner::activation_bytes(*g, chunk, 1);
  bytes.kv = (*store)->coordinator().reserved_bytes();
  bytes.kv_tokens = kv_tokens;
  return std::unique_ptr<DraftModelDrafter>(new DraftModelDrafter(
      std::move(model).value(), std::move(store).value(), bytes, chunk, backend));
}

void DraftModelDrafter::touch(kv::SeqId seq) {
  lru_.remove(seq);
  lru_.push_back(seq);
}

void DraftModelDrafter::forget(kv::SeqId seq) {
  lru_.remove(seq);
  context_ids_.erase(seq);
  (void)store_->coordinator().free(seq);
}

void DraftModelDrafter::release(kv::SeqId seq) {
  forget(seq);
}

bool DraftModelDrafter::append(kv::SeqId seq, int64_t written, std::span<const int32_t> tokens) {
  // append_tokens changes nothing when the tokens do not fit: forget the least recently drafted
  // other sequence and try again.
  while (!store_->append_tokens(seq, written, tokens)) {
    const auto victim =
        std::find_if(lru_.begin(), lru_.end(), [&](kv::SeqId s) { return s != seq; });
    if (victim == lru_.end()) return false;
    forget(*victim);
  }
  return true;
}

bool DraftModelDrafter::read(kv::SeqId seq, std::span<const int32_t> tokens) {
  kv::BlockManager& m = store_->coordinator().manager();
  int64_t written = m.has_sequence(seq) ? m.num_tokens(seq) : 0;
  for (size_t off = 0; off < tokens.size(); off += static_cast<size_t>(chunk_)) {
    const auto piece =
        tokens.subspan(off, std::min(tokens.size() - off, static_cast<size_t>(chunk_)));
    const auto n = static_cast<int64_t>(piece.size());
    if (!append(seq, written, piece)) {
      forget(seq);
      return false;
    }
    SequenceKv view(*store_, seq, written, std::numeric_limits<int64_t>::max());
    BatchSequence b;
    b.tokens = piece;
    b.kv = &view;
    b.logits = BatchSequence::Logits::kLast;
    b.path = n > 4 ? MatmulPath::kPrefill : MatmulPath::kDecode;
    const BatchSequence batch[1] = {b};
    auto out = model_->forward_batch(batch, backend_);
    if (!out) {
      forget(seq);
      return false;
    }
    view.finish_pass();
    logits_ = *out;
    ++passes_;
    tokens_read_ += n;
    written += n;
  }
  return true;
}

int32_t DraftModelDrafter::best_token(kv::SeqId seq) {
  const auto n_logits = static_cast<size_t>(model_->n_logits());
  const auto best = std::max_element(logits_.begin(), logits_.begin() + n_logits);
  auto token = static_cast<int32_t>(best - logits_.begin());
  const auto it = context_ids_.find(seq);
  if (it == context_ids_.end() || it->second.empty()) return token;
  auto extra = model_->logits_of(it->second, backend_);
  if (!extra.ok()) return token;  // a draft only: the trimmed head's choice stands
  float top = *best;
  for (size_t k = 0; k < extra->size(); ++k) {
    if ((*extra)[k] > top) {
      top = (*extra)[k];
      token = it->second[k];
    }
  }
  return token;
}

void DraftModelDrafter::propose(kv::SeqId seq, std::span<const int32_t> tokens, int max_tokens,
                                std::vector<int32_t>& out) {
  out.clear();
  if (max_tokens <= 0 || tokens.empty()) return;
  kv::BlockManager& m = store_->coordinator().manager();
  // Keep the longest prefix the copy shares with the sequence (drafts the target rejected go),
  // always re-reading at least the last token: its logits start the drafts.
  int64_t keep = 0;
  if (m.has_sequence(seq)) {
    const auto have = m.tokens(seq);
    const size_t lim = std::min(have.size(), tokens.size() - 1);
    keep = std::mismatch(have.begin(), have.begin() + static_cast<ptrdiff_t>(lim), tokens.begin())
               .first -
           have.begin();
    if (keep == 0) {
      forget(seq);
    } else if (!store_->coordinator().truncate(seq, keep)) {
      forget(seq);
      keep = 0;
    }
  }
  touch(seq);
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t trim = model_->n_logits();
  if (trim < model_->geometry().n_vocab) {
    std::vector<int32_t>& ctx = context_ids_[seq];
    for (const int32_t id : tokens.subspan(static_cast<size_t>(keep))) {
      if (id < trim) continue;
      const auto at = std::lower_bound(ctx.begin(), ctx.end(), id);
      if (at == ctx.end() || *at != id) ctx.insert(at, id);
    }
  }
  if (!read(seq, tokens.subspan(static_cast<size_t>(keep)))) return;
  for (int i = 0; i < max_tokens; ++i) {
    out.push_back(best_token(seq));
    // The last draft's K/V is not needed now (the next call re-reads from where they differ).
    if (i + 1 == max_tokens || !read(seq, std::span<const int32_t>(&out.back(), 1))) break;
  }
  // The cost of a draft token: the whole call over its drafts, so that catching up on tokens
  // another drafter proposed counts too. A first read of the sequence (its prompt) is left out.
  if (keep > 0 && !out.empty()) {
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                       static_cast<double>(out.size());
    step_seconds_ = step_seconds_ > 0 ? 0.8 * step_seconds_ + 0.2 * sec : sec;
  }
}

}  // namespace bie
