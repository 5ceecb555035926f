// DraftModelDrafter: speculative drafts from a smaller model with the target's vocabulary
// (--speculative-model). It keeps its own paged FP16 KV cache (a PagedKvStore with an unmixed f16
// layout, sized inside the engine's memory budget) holding, per target sequence, the K/V of the
// tokens it has already read. To propose, it rolls its copy back to the longest prefix it shares
// with the sequence (rejected drafts), reads the new tokens in one pass, then runs greedily one
// token at a time. Drafts are deterministic (q = one-hot), so the target's rejection rule keeps the
// output distribution exactly the target's. When its cache is full it forgets the least recently
// used other sequences; a sequence it cannot hold gets no drafts. One per engine; engine thread
// only; runs on the engine's backend.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "bie/backend/backend.h"
#include "bie/common/result.h"
#include "bie/engine/drafter.h"
#include "bie/kv/paged_kv_store.h"
#include "bie/model/model.h"

namespace bie::tokenizer {
class Vocab;
}

namespace bie {

// What a draft model costs in the engine's budget (the start-up report's "draft" part).
struct DraftModelBytes {
  uint64_t weights = 0;
  uint64_t workspace = 0;  // activations of one catch-up chunk
  uint64_t kv = 0;         // its f16 pools
  int64_t kv_tokens = 0;   // tokens those pools hold
  [[nodiscard]] uint64_t total() const { return weights + workspace + kv; }
};

class DraftModelDrafter final : public Drafter {
 public:
  // Loads the draft model and checks it against the target's vocabulary (same size, same token
  // texts and special ids: otherwise its ids would mean other text). kv_tokens: tokens its cache
  // holds across sequences; chunk: tokens per catch-up pass; draft_vocab: drafts come from token
  // ids [0, draft_vocab) only (0: the whole vocabulary; LoadOptions::logits_vocab).
  [[nodiscard]] static Result<std::unique_ptr<DraftModelDrafter>> create(
      const std::string& path, const tokenizer::Vocab& target_vocab, int64_t kv_tokens,
      int32_t chunk, Backend& backend, int32_t draft_vocab = 0);

  void propose(kv::SeqId seq, std::span<const int32_t> tokens, int max_tokens,
               std::vector<int32_t>& out) override;
  void release(kv::SeqId seq) override;
  // Seconds per drafted token: a propose call's time (catch-up read included) over its drafts,
  // running mean; 0 until a call that was not the sequence's first read.
  [[nodiscard]] double seconds_per_token() const override { return step_seconds_; }

  [[nodiscard]] const DraftModelBytes& bytes() const { return bytes_; }
  [[nodiscard]] const Model& model() const { return *model_; }
  // Forward passes run and tokens read by them (prompt catch-up included).
  [[nodiscard]] int64_t forward_passes() const { return passes_; }
  [[nodiscard]] int64_t tokens_read() const { return tokens_read_; }
  [[nodiscard]] const PagedKvStore& store() const { return *store_; }

 private:
  DraftModelDrafter(std::unique_ptr<Model> model, std::unique_ptr<PagedKvStore> store,
                    DraftModelBytes bytes, int32_t chunk, Backend& backend)
      : model_(std::move(model)),
        store_(std::move(store)),
        bytes_(bytes),
        chunk_(chunk),
        backend_(backend) {}
  // Runs `tokens` after the draft's copy of seq (appending them); logits of the last one in
  // logits_. False (copy rolled back) when the cache cannot hold them.
  [[nodiscard]] bool read(kv::SeqId seq, std::span<const int32_t> tokens);
  // Appends tokens to seq's copy, forgetting other sequences (least recently drafted first) until
  // they fit; false when they do not fit even alone.
  [[nodiscard]] bool append(kv::SeqId seq, int64_t written, std::span<const int32_t> tokens);
  void touch(kv::SeqId seq);
  void forget(kv::SeqId seq);
  // The draft after the last pass: the best trimmed-head logit, or a better one among the ids of
  // seq's text that the trimmed head leaves out.
  [[nodiscard]] int32_t best_token(kv::SeqId seq);

  std::unique_ptr<Model> model_;
  std::unique_ptr<PagedKvStore> store_;
  DraftModelBytes bytes_;
  // A trimmed head's complement per sequence: the ids >= its size that occur in the sequence's
  // text (sorted), so that names and symbols copied from the prompt can still be drafted.
  std::unordered_map<kv::SeqId, std::vector<int32_t>> context_ids_;
  int32_t chunk_;
  Backend& backend_;
  std::span<float> logits_;   // the last pass's (the model's memory)
  std::list<kv::SeqId> lru_;  // sequences with a copy, least recently drafted first
  int64_t passes_ = 0;
  int64_t tokens_read_ = 0;
  double step_seconds_ = 0.0;
};

// Checks that a draft model's vocabulary is the target's; the error names the first difference.
[[nodiscard]] Status check_same_vocab(const tokenizer::Vocab& target,
                                      const tokenizer::Vocab& draft);

}  // namespace bie
