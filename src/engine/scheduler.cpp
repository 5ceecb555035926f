#include "bie/engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

namespace bie {

int64_t SchedulerOutput::n_tokens() const {
  int64_t n = 0;
  for (const ScheduledSeq& s : scheduled) n += s.n_tokens + s.n_draft;
  return n;
}

kv::KvWork& SchedulerOutput::work_for(PagedKvStore* store) {
  for (StoreWork& w : kv_work) {
    if (w.store == store) return w.work;
  }
  kv_work.push_back({store, {}});
  return kv_work.back().work;
}

Scheduler::Scheduler(const SchedulerConfig& cfg, PagedKvStore& store)
    : Scheduler(cfg, std::vector<PagedKvStore*>{&store}) {}

Scheduler::Scheduler(const SchedulerConfig& cfg, std::vector<PagedKvStore*> stores)
    : cfg_(cfg), stores_(std::move(stores)) {
  assert(!stores_.empty());
}

void Scheduler::add(kv::SeqId id, std::vector<int32_t> prompt, PagedKvStore* store) {
  assert(seqs_.count(id) == 0 && !prompt.empty());
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->store = store != nullptr ? store : stores_.front();
  s->arrival = next_arrival_++;
  s->n_prompt = static_cast<int64_t>(prompt.size());
  s->tokens = std::move(prompt);
  s->cached_tokens = -1;  // not admitted yet
  waiting_.push_back(id);
  seqs_.emplace(id, std::move(s));
}

Sequence* Scheduler::find(kv::SeqId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

Status Scheduler::finish(kv::SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return Error{fmt::format("scheduler: unknown sequence {}", id)};
  if (Status s = it->second->store->coordinator().free(id); !s) return s;
  std::erase(running_, id);
  std::erase(waiting_, id);
  it->second->status = SeqStatus::kFinished;
  seqs_.erase(it);
  return {};
}

namespace {

bool per_channel_layout(const PagedKvStore& store) {
  return store.layout().has_per_channel();
}

}  // namespace

int64_t Scheduler::prefill_span(const Sequence& s) const {
  // A mixed layout's chunks are short enough that each token sees half the FP16 window.
  int64_t span = s.store->layout().prefill_chunk(cfg_.chunked_prefill_size);
  if (per_channel_layout(*s.store)) {
    // A chunk of a per-channel layout must be able to reach the next block boundary.
    const int64_t B = s.store->layout().block_size;
    span = std::max(span, B - s.computed % B);
  }
  return span;
}

int64_t Scheduler::chunk_for(const Sequence& s, int64_t budget) const {
  const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
  int64_t n =
      std::min({remaining, budget, s.store->layout().prefill_chunk(cfg_.chunked_prefill_size)});
  if (n <= 0) return 0;
  if (per_channel_layout(*s.store) && n < remaining) {
    // A body block of a per-channel format is written as a whole tile: a chunk that is not the
    // last ends on a block boundary (the last one ends in the FP16 window). Rounded down, a
    // chunk shorter than the rest of its block would be empty, every step, and the sequence
    // would never run: such a chunk runs to the boundary instead if the step's budget holds it
    // (--chunked-prefill-size is a target; the budget, which sizes the workspace, is the
    // limit), and waits for a step with that budget otherwise (Engine refuses a budget below
    // the block size).
    const int64_t B = s.store->layout().block_size;
    const int64_t down = (s.computed + n) / B * B - s.computed;
    const int64_t up = std::min(remaining, B - s.computed % B);
    n = down > 0 ? down : up <= budget ? up : 0;
  }
  return n;
}

int64_t Scheduler::tokens_to_hold(const Sequence& s) const {
  const auto known = static_cast<int64_t>(s.tokens.size());
  // A mixed layout holds one chunk past what is computed, so a prompt's blocks are written FP16
  // and move to the body when later chunks push them out of the window (each prompt token sees
  // the recent window in FP16, KvLayout::prefill_chunk_cap); so does a store with local groups
  // (their blocks are dropped as the window passes). Otherwise the whole prompt is held at once.
  if (!s.store->coordinator().has_local_groups() && !s.store->layout().mixed()) return known;
  return std::min(known, s.computed + prefill_span(s));
}

int64_t Scheduler::tokens_to_hold_at_start(const Sequence& s) const {
  const int64_t n_hold = tokens_to_hold(s);  // s.computed is 0 while waiting
  const auto known = static_cast<int64_t>(s.tokens.size());
  if (n_hold == known) return n_hold;
  // A store with local groups holds a chunk past what is computed; a prefix hit counts as
  // computed, so the first append reaches one chunk past the longest hit (if the hit still holds
  // at that length: the window's FP16 roles move with it).
  const int64_t hit = s.store->coordinator().prefix_hit_tokens(s.tokens);
  if (hit == 0) return n_hold;
  const int64_t n_try = std::min(known, hit + prefill_span(s));
  const auto first = std::span<const int32_t>(s.tokens).first(static_cast<size_t>(n_try));
  return s.store->coordinator().prefix_hit_tokens(first) == hit ? n_try : n_hold;
}

bool Scheduler::ensure_blocks(Sequence& s, kv::KvWork& work, bool draft) {
  kv::KvCoordinator& kv = s.store->coordinator();
  const kv::BlockManager& m = kv.manager();
  const int64_t held = m.has_sequence(s.id) ? m.num_tokens(s.id) : 0;
  const int64_t known = tokens_to_hold(s);
  // append plans the append (a dry run) and changes nothing when it does not fit.
  if (held < known) {
    const auto fresh = std::span<const int32_t>(s.tokens).subspan(
        static_cast<size_t>(held), static_cast<size_t>(known - held));
    if (!kv.append(s.id, s.computed, fresh, /*migrate=*/true, work).ok()) return false;
  }
  if (!draft || s.draft.empty()) return true;
  return kv.append(s.id, s.computed, s.draft, /*migrate=*/false, work).ok();
}

void Scheduler::preempt(kv::SeqId id, SchedulerOutput& out) {
  Sequence& s = *seqs_.at(id);
  // Work queued for its blocks earlier in this step must not run on blocks it no longer holds
  // (another sequence may be handed them in the same step).
  std::erase_if(out.work_for(s.store), [id](const kv::KvWorkItem& w) { return w.seq == id; });
  (void)s.store->coordinator().free(id);
  s.computed = 0;
  s.status = SeqStatus::kWaiting;
  ++s.preemptions;
  ++preemptions_;
  std::erase(running_, id);
  waiting_.push_front(id);
  out.preempted.push_back(id);
}

Status Scheduler::restart_in(kv::SeqId id, PagedKvStore* store) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->status != SeqStatus::kRunning ||
      it->second->n_generated() != 0 || store == nullptr) {
    return Error{fmt::format("sequence {} cannot move to another KV regime: it is not a running "
                             "sequence that has generated nothing",
                             id)};
  }
  Sequence& s = *it->second;
  if (Status st = s.store->coordinator().free(id); !st) return st;
  s.store = store;
  s.computed = 0;
  s.status = SeqStatus::kWaiting;
  std::erase(running_, id);
  waiting_.push_front(id);
  return {};
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = cfg_.max_num_batched_tokens;
  // Running sequences first, oldest first; the newest gives up its blocks when one is short.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const kv::SeqId id = running_[i];
    Sequence& s = *seqs_.at(id);
    // Speculation: the decode token and its drafts, if they fit the budget and the blocks.
    if (!s.decoding()) s.draft.clear();
    if (static_cast<int64_t>(s.draft.size()) > budget - 1) {
      s.draft.resize(static_cast<size_t>(std::max<int64_t>(budget - 1, 0)));
    }
    if (!s.draft.empty()) {
      if (ensure_blocks(s, out.work_for(s.store), /*draft=*/true)) {
        const auto nd = static_cast<int64_t>(s.draft.size());
        out.scheduled.push_back({.seq = &s, .n_tokens = 1, .n_draft = nd, .sample = true});
        budget -= 1 + nd;
        continue;
      }
      s.draft.clear();  // no blocks for drafts this step: plain decode
    }
    bool preempted_self = false;
    while (!ensure_blocks(s, out.work_for(s.store))) {
      const kv::SeqId victim = running_.back();
      preempt(victim, out);
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // it was the newest: nothing after it runs
    const int64_t n = chunk_for(s, budget);
    if (n == 0) continue;
    out.scheduled.push_back({.seq = &s,
                             .n_tokens = n,
                             .sample = s.computed + n == static_cast<int64_t>(s.tokens.size())});
    budget -= n;
  }
  // Then waiting sequences in FCFS order; one that does not fit blocks those behind it. None is
  // admitted in a step that had to preempt (blocks are short).
  int64_t slots = 0;  // running sequences and the choices they will fork
  for (const kv::SeqId id : running_) slots += 1 + seqs_.at(id)->forks;
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 && slots < cfg_.max_num_seqs) {
    const kv::SeqId id = waiting_.front();
    Sequence& s = *seqs_.at(id);
    if (slots + 1 + s.forks > cfg_.max_num_seqs) break;
    const auto n_known = static_cast<int64_t>(s.tokens.size());
    const int64_t n_hold = tokens_to_hold_at_start(s);
    const auto first = std::span<const int32_t>(s.tokens).first(static_cast<size_t>(n_hold));
    kv::KvCoordinator& kv = s.store->coordinator();
    if (!kv.can_start(first)) break;
    auto cached = kv.append(id, 0, first, /*migrate=*/true, out.work_for(s.store));
    if (!cached) break;  // unreachable after can_start
    s.computed = *cached;
    if (s.cached_tokens < 0) s.cached_tokens = *cached;
    s.status = SeqStatus::kRunning;
    waiting_.pop_front();
    running_.push_back(id);
    slots += 1 + s.forks;
    const int64_t n = chunk_for(s, budget);
    if (n == 0) continue;
    out.scheduled.push_back({.seq = &s, .n_tokens = n, .sample = s.computed + n == n_known});
    budget -= n;
  }
  return out;
}

Status Scheduler::commit(const ScheduledSeq& sc, int64_t n_verified) {
  Sequence& s = *sc.seq;
  assert(n_verified >= sc.n_tokens && n_verified <= sc.n_tokens + sc.n_draft);
  kv::KvCoordinator& kv = s.store->coordinator();
  if (sc.n_draft > 0) {
    // Rejected drafts: back to the verified length (their blocks are FP16 window blocks).
    if (Status st = kv.truncate(s.id, s.computed + n_verified); !st) return st;
    s.draft.clear();
  }
  s.computed += n_verified;
  return kv.mark_computed(s.id, s.computed);
}

Status Scheduler::fork(kv::SeqId parent, kv::SeqId child) {
  assert(seqs_.count(child) == 0);
  Sequence& p = *seqs_.at(parent);
  assert(p.status == SeqStatus::kRunning && p.forks > 0 && !p.in_prompt());
  if (Status st = p.store->coordinator().fork(parent, child); !st) return st;
  auto c = std::make_unique<Sequence>(p);
  c->id = child;
  c->arrival = next_arrival_++;
  c->forks = 0;
  c->draft.clear();
  --p.forks;
  running_.push_back(child);
  seqs_.emplace(child, std::move(c));
  return {};
}

void Scheduler::append_token(kv::SeqId id, int32_t token) {
  seqs_.at(id)->tokens.push_back(token);
}

Status Scheduler::check_integrity() const {
  std::unordered_map<const PagedKvStore*, int64_t> running_in;
  for (const kv::SeqId id : running_) {
    const Sequence& s = *seqs_.at(id);
    const kv::BlockManager& m = s.store->coordinator().manager();
    ++running_in[s.store];
    if (!m.has_sequence(id)) return Error{fmt::format("running sequence {} holds no blocks", id)};
    if (m.num_computed(id) != s.computed) {
      return Error{fmt::format("sequence {}: computed {} but the manager says {}", id, s.computed,
                               m.num_computed(id))};
    }
  }
  for (const kv::SeqId id : waiting_) {
    const Sequence& s = *seqs_.at(id);
    if (s.store->coordinator().has_sequence(id)) {
      return Error{fmt::format("waiting sequence {} holds blocks", id)};
    }
  }
  for (const PagedKvStore* st : stores_) {
    const int64_t held = st->coordinator().manager().num_sequences();
    if (held != running_in[st]) {
      return Error{fmt::format("a KV store holds {} sequences, {} of its sequences are running",
                               held, running_in[st])};
    }
    if (Status s = st->check_integrity(); !s) return s;
  }
  return {};
}

}  // namespace bie
