// Scheduler: continuous batching over the paged KV store. Each step it first gives every running
// sequence its next tokens (one decode token, or the next prefill chunk), oldest first, then
// admits waiting sequences in FCFS order while the token budget, --max-num-seqs and free KV
// blocks allow; a sequence that cannot be admitted blocks those behind it (no starvation). When
// a running sequence needs a block and none is free, the newest running sequence is preempted:
// its blocks are freed and it goes back to the front of the waiting queue, to be recomputed
// (cheaply, through the prefix cache) when blocks return. Owns the queues and the sequences; each
// store's KV coordinator owns the blocks and answers whether a sequence fits. The data work its
// block decisions imply (copy-on-write copies, window exits) comes back in the step's output,
// for the model runner to execute before the pass. Not thread-safe (engine thread).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "bie/common/result.h"
#include "bie/engine/sequence.h"
#include "bie/kv/paged_kv_store.h"

namespace bie {

struct SchedulerConfig {
  int64_t max_num_seqs = 16;             // sequences running at once
  int64_t max_num_batched_tokens = 512;  // tokens per step (decode tokens + prefill chunks)
  int64_t chunked_prefill_size = 512;    // most prompt tokens of one sequence per step
  int64_t max_model_len = 8192;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  // Run tokens [seq->computed, seq->computed + n_tokens) of seq->tokens, then n_draft draft
  // tokens (seq->draft[0, n_draft)) to verify.
  int64_t n_tokens = 0;
  int64_t n_draft = 0;
  bool sample = false;  // the chunk reaches the last known token: sample the next one
};

// The KV data work of one store's block decisions in a step, in decision order.
struct StoreWork {
  PagedKvStore* store = nullptr;
  kv::KvWork work;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> scheduled;
  std::vector<kv::SeqId> preempted;  // this step, newest first
  // Copies and quantisations the step's block decisions imply, per store: executed before the
  // pass (ModelRunner::prepare_kv), also when nothing is scheduled.
  std::vector<StoreWork> kv_work;
  [[nodiscard]] int64_t n_tokens() const;
  // The work list of `store` (made on first use).
  [[nodiscard]] kv::KvWork& work_for(PagedKvStore* store);
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, PagedKvStore& store);
  // Several stores (one per KV regime) drawing on one memory budget (kv::MemoryBudget): each
  // sequence lives in the store it was added with; preemption frees the newest sequence whatever
  // its store. stores.front() is the default.
  Scheduler(const SchedulerConfig& cfg, std::vector<PagedKvStore*> stores);

  // Adds a sequence (tokens = prompt) at the back of the waiting queue, in `store` (nullptr: the
  // default store).
  // note: call only with a new id and 1 <= tokens.size() <= max_model_len.
  void add(kv::SeqId id, std::vector<int32_t> prompt, PagedKvStore* store = nullptr);
  [[nodiscard]] Sequence* find(kv::SeqId id);
  // Frees the sequence's blocks and forgets it (finished, cancelled).
  [[nodiscard]] Status finish(kv::SeqId id);

  [[nodiscard]] SchedulerOutput schedule();
  // After the forward pass: the first n_verified scheduled tokens of sc (its n_tokens, plus the
  // accepted drafts) are computed; full blocks among them enter the prefix cache, rejected draft
  // positions are rolled back (FP16 window blocks only). Sampled tokens come via append_token.
  [[nodiscard]] Status commit(const ScheduledSeq& sc, int64_t n_verified);
  // Starts `child` as a copy of running `parent` sharing every KV block (ref counts + 1; the
  // partly filled last block is copied on the first append): one of n choices. Takes one of
  // parent's forks.
  // note: call only with a new id, after parent's prompt is computed (commit) and before a
  // token is appended to it.
  [[nodiscard]] Status fork(kv::SeqId parent, kv::SeqId child);
  // Moves a running sequence whose prompt is computed (committed) and that has generated nothing
  // to `store`, another KV regime's: its blocks are freed (its full prompt blocks stay in the old
  // store's prefix cache) and it waits at the front of the queue to be computed again there. Not
  // a preemption (not counted as one).
  [[nodiscard]] Status restart_in(kv::SeqId id, PagedKvStore* store);
  // Appends a sampled token to a running sequence (its blocks are taken at the next schedule()).
  void append_token(kv::SeqId id, int32_t token);

  [[nodiscard]] int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  [[nodiscard]] int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  [[nodiscard]] int64_t preemptions() const { return preemptions_; }
  [[nodiscard]] bool idle() const { return running_.empty() && waiting_.empty(); }
  [[nodiscard]] const std::deque<kv::SeqId>& waiting() const { return waiting_; }
  [[nodiscard]] const std::vector<kv::SeqId>& running() const { return running_; }
  // Every sequence's manager state matches its counts; the store's integrity.
  [[nodiscard]] Status check_integrity() const;

 private:
  // Tokens of the next prefill chunk of s within `budget` (0: none fits this step).
  [[nodiscard]] int64_t chunk_for(const Sequence& s, int64_t budget) const;
  // The most prompt tokens the next chunk of s may take: --chunked-prefill-size, or with a
  // per-channel layout at least the rest of the block s.computed lies in (see chunk_for).
  [[nodiscard]] int64_t prefill_span(const Sequence& s) const;
  // Makes the manager hold every known token of s (decode: the last sampled token) and, with
  // draft, its draft tokens (no window exits for those: they may be rolled back).
  [[nodiscard]] bool ensure_blocks(Sequence& s, kv::KvWork& work, bool draft = false);
  // Tokens of s its store should hold before the next pass: every known token, except in a store
  // with sliding-window layer groups, which holds a prompt one chunk ahead only (the chunk's
  // blocks of a local group are dropped after its pass, so the whole prompt is never held).
  [[nodiscard]] int64_t tokens_to_hold(const Sequence& s) const;
  // The same for a waiting sequence about to start: one chunk past its prefix-cache hit.
  [[nodiscard]] int64_t tokens_to_hold_at_start(const Sequence& s) const;
  void preempt(kv::SeqId id, SchedulerOutput& out);

  SchedulerConfig cfg_;
  std::vector<PagedKvStore*> stores_;
  uint64_t next_arrival_ = 0;
  std::unordered_map<kv::SeqId, std::unique_ptr<Sequence>> seqs_;
  std::deque<kv::SeqId> waiting_;
  std::vector<kv::SeqId> running_;  // admission order (oldest first)
  int64_t preemptions_ = 0;
};

}  // namespace bie
