// Model: a loaded architecture — hyper-parameters read from GGUF metadata and weights checked by
// name, shape and type once, at load. forward() runs a batch of consecutive tokens of one sequence
// through the network on a Backend, reading and writing K/V through the KvCache interface. The
// first pass on a backend uploads the weights to it (the CPU backend views the mmapped file) and
// allocates the activation workspace in its memory; a pass on another backend binds to that one
// instead. Weights are immutable after load; forward() is not re-entrant (it uses the model's
// activation workspace) and is called from the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bie/attention/attention_entropy.h"
#include "bie/backend/backend.h"
#include "bie/backend/matmul_path.h"
#include "bie/common/result.h"
#include "bie/gguf/gguf_file.h"
#include "bie/kv/kv_cache.h"
#include "bie/planner/model_geometry.h"

namespace bie {

enum class RopeLayout {
  kNorm,  // rotate adjacent pairs (x[2i], x[2i+1]) — llama, mistral (GGUF Q/K are pre-permuted)
  kNeox,  // rotate halves (x[i], x[i + n_rot/2]) — qwen2
};

struct ForwardOptions {
  bool logits_all = false;  // logits for every token of the batch, not only the last
  // The kernels the tokens' matmuls use (see MatmulPath): generation names kPrefill for prompt
  // tokens and kDecode for generated ones, so results do not depend on how tokens are batched.
  MatmulPath path = MatmulPath::kAuto;
  // Non-empty ([n_layer * n_head]): the pass measures the attention entropy of the last token at
  // every layer (attention::attention_entropy), query head h of layer il at [il * n_head + h]
  // (caches with host blocks only; another cache fails the pass).
  std::span<attention::HeadEntropy> attn_entropy;
};

// One sequence's part of a batched forward pass: `tokens` run at positions
// [kv->n_tokens(), kv->n_tokens() + tokens.size()) of that sequence's cache.
struct BatchSequence {
  enum class Logits : uint8_t { kNone, kLast, kAll };
  std::span<const int32_t> tokens;
  KvCache* kv = nullptr;
  Logits logits = Logits::kLast;
  // Tokens [0, decode_from) are prompt tokens (MatmulPath::kPrefill), the rest generated ones
  // (kDecode); -1 with `path` below for all of them.
  int64_t decode_from = -1;
  MatmulPath path = MatmulPath::kAuto;  // used when decode_from < 0
  // Non-empty ([n_layer * n_head]): measure the last token's attention entropy at every layer,
  // as ForwardOptions::attn_entropy.
  std::span<attention::HeadEntropy> attn_entropy;
};

class Model {
 public:
  virtual ~Model() = default;

  // The model's shape, read once at load by the planner's reader of a file's shape (the engine,
  // the planner and the KV cache read this one description).
  [[nodiscard]] const planner::ModelGeometry& geometry() const { return geo_; }
  [[nodiscard]] const gguf::GgufFile& file() const { return *file_; }
  // Bytes of weight tensors (as stored in the file).
  [[nodiscard]] uint64_t weight_bytes() const { return weight_bytes_; }
  // Logits per row a pass returns: n_vocab, or LoadOptions::logits_vocab where that trims them.
  [[nodiscard]] int32_t n_logits() const { return n_logits_; }

  // Runs tokens at positions [kv.n_tokens(), kv.n_tokens() + tokens.size()) after appending them
  // to the cache. Returns logits: [tokens.size(), n_logits] if opts.logits_all, else [1, n_logits]
  // for the last token, and then finishes the pass on the cache (KvCache::finish_pass). On error
  // nothing is appended.
  [[nodiscard]] Result<std::span<float>> forward(std::span<const int32_t> tokens, KvCache& kv,
                                                 Backend& backend, ForwardOptions opts = {});
  // Runs the tokens of several sequences in one pass: every weight matrix is read once for all
  // of them, attention runs per sequence through its own cache. Returns logits rows in sequence
  // order: one per kLast sequence, one per token of a kAll sequence ([rows, n_logits], fp32 in
  // host memory owned by the model, valid until its next pass; the caller may modify them in
  // place). The total token count must fit the workspace (LoadOptions::max_batch_tokens). On
  // error nothing is appended to any cache. The caller finishes the pass on each cache
  // (KvCache::finish_pass) when it has decided what the pass's tokens are (draft tokens stay).
  [[nodiscard]] virtual Result<std::span<float>> forward_batch(std::span<const BatchSequence> seqs,
                                                               Backend& backend) = 0;
  // Logits of the token ids `ids` for the first logits row of the last pass, from the whole
  // output layer: what a trimmed head (LoadOptions::logits_vocab) leaves out, for a few ids.
  // fp32 in host memory owned by the model, valid until its next pass or call. Computed from
  // dequantised rows, not by the head's kernels: they may differ from an untrimmed head's logits
  // in the last bits. Call after a pass that returned logits, on the same backend.
  [[nodiscard]] virtual Result<std::span<const float>> logits_of(std::span<const int32_t> ids,
                                                                 Backend& backend) = 0;
  // Uploads the weights to `backend` and allocates the activation workspace there: the GGUF data
  // section plus planner::device_workspace_bytes(max_batch_tokens, max_output_rows) (a first pass
  // on a backend does this itself; call it to hold the memory from start-up). A no-op when bound.
  [[nodiscard]] virtual Status bind(Backend& backend) = 0;

 protected:
  std::unique_ptr<gguf::GgufFile> file_;
  planner::ModelGeometry geo_;
  uint64_t weight_bytes_ = 0;
  int32_t n_logits_ = 0;
};

struct LoadOptions {
  // Upper bound on tokens per forward() call; sizes the activation workspace (prefill chunk).
  int32_t max_batch_tokens = 512;
  // Logits rows the workspace holds from bind(); a pass that returns more grows it.
  int32_t max_output_rows = 1;
  // 0: logits for every token. Else logits for token ids [0, logits_vocab) only: the output layer
  // reads that many of its rows (a speculative draft's trimmed head; byte-level BPE vocabularies
  // number their tokens in merge order, so the low ids are the frequent ones).
  int32_t logits_vocab = 0;
};

// Opens a GGUF file and binds the weights of its architecture. Errors name the file and what is
// wrong: unknown architecture, missing tensor, wrong shape, tensor type BIE cannot compute with.
[[nodiscard]] Result<std::unique_ptr<Model>> load_model(const std::string& path,
                                                        LoadOptions opts = {});

// Architectures load_model() accepts.
[[nodiscard]] std::vector<std::string> supported_architectures();

}  // namespace bie
