// KvCoordinator: the KV cache's decisions across layer groups, as metadata only. Owns one
// BlockManager per layer group (planner::kv_pool_plan's groups: all layers for a model without
// sliding windows, else one group of global layers and one of local layers per window) and is
// the one place that asks and acts across them: prefix hits every group serves, append plans
// (blocks in the pool of their role, window exits between the pieces of a chunked append),
// window exits and sliding-window drops after a pass, the shared memory budget. It touches no
// KV data: what its decisions imply for the pools' memory (copy-on-write copies, FP16 -> body
// quantisations) comes back as a KvWork list, in the order it must run, for the KV storage
// (PagedKvStore) to execute before the next pass reads the blocks.
// "Can" and "do" share one code path: can_append is whether append's plan exists, and append
// executes exactly that plan's pieces and migrations, so the two cannot drift.
// Not thread-safe (engine thread).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bie/common/result.h"
#include "bie/kv/block_manager.h"
#include "bie/kv/kv_cache.h"

namespace bie::planner {
struct ModelGeometry;
}

namespace bie::kv {

// The planner's view of a KV geometry (one LayerKv per layer, windows kept): what the pool
// planner and the layout checks read.
[[nodiscard]] planner::ModelGeometry planner_geometry(const KvGeometry& geo);

struct KvCoordinatorConfig {
  KvGeometry geometry;
  planner::KvLayout layout;  // body formats, block size, sink and window tokens
  int64_t fp16_blocks = 0;   // pool sizes of a one-group geometry (see planner::kv_pool_plan)
  int64_t body_blocks = 0;
  // Pool sizes per layer group, in planner::kv_pool_plan's order; required when the geometry has
  // sliding-window layers (then fp16_blocks/body_blocks are ignored).
  std::vector<planner::KvGroupPool> groups;
  std::string model_id = "bie-paged-kv";  // keys the prefix cache (e.g. the model's sha256)
  bool enable_prefix_caching = false;
  // Shared byte budget (several stores, one per KV regime): the pools draw on it and
  // fp16_blocks/body_blocks/groups are ignored (BlockManagerConfig::budget); every group's
  // manager draws on it.
  MemoryBudget* budget = nullptr;
  // With a budget: the pools hold exactly fp16_blocks/body_blocks/groups (the budget still bounds
  // what is active). A device allocates its pools up front, so it holds the plan's pools instead
  // of ids for the whole budget in every pool (BlockManagerConfig::sizes_as_given).
  bool pools_as_given = false;
  // KV events of every group's prefix index (BlockManagerConfig::events); a coordinator of
  // several layer groups names them "<events_medium>/g<group>/<pool>".
  KvEventSink* events = nullptr;
  std::string events_medium = "kv";
};

// Data work a coordinator's decisions imply, in the order it must run (a later item may read
// what an earlier one wrote). The storage runs it before any pass reads the blocks involved.
struct KvWorkItem {
  enum class Kind : uint8_t {
    kCopy,      // copy-on-write: `copy.src` -> `copy.dst`, whole block, same pool
    kQuantise,  // window exit: `rows` rows of every layer of FP16 block `src` -> body block `dst`
  };
  Kind kind = Kind::kCopy;
  int group = 0;  // the layer group whose pools hold the blocks
  KvCopy copy;
  BlockRef src;
  BlockRef dst;
  int rows = 0;
  SeqId seq = -1;  // whose blocks these are (a scheduler that frees the sequence drops its work)
};
using KvWork = std::vector<KvWorkItem>;

class KvCoordinator {
 public:
  // Checks the pool sizes against the layer groups and creates the managers.
  [[nodiscard]] static Result<std::unique_ptr<KvCoordinator>> create(
      const KvCoordinatorConfig& cfg);

  [[nodiscard]] const KvCoordinatorConfig& config() const { return cfg_; }
  [[nodiscard]] const planner::KvLayout& layout() const { return cfg_.layout; }
  // The lead manager: the first group of global layers (the prefix cache, token ids, computed
  // counts and block tables the scheduler reads); group 0 if every layer is local.
  [[nodiscard]] BlockManager& manager() { return *groups_[lead_].mgr; }
  [[nodiscard]] const BlockManager& manager() const { return *groups_[lead_].mgr; }
  [[nodiscard]] int n_groups() const { return static_cast<int>(groups_.size()); }
  [[nodiscard]] BlockManager& manager(int g) { return *groups_[static_cast<size_t>(g)].mgr; }
  [[nodiscard]] const BlockManager& manager(int g) const {
    return *groups_[static_cast<size_t>(g)].mgr;
  }
  // Sliding window of group g's layers (0: global), its layer count, and layer il's group and
  // place within its group's block.
  [[nodiscard]] int64_t group_window(int g) const { return groups_[static_cast<size_t>(g)].window; }
  [[nodiscard]] int group_layers(int g) const { return groups_[static_cast<size_t>(g)].n_layers; }
  // Group g's body formats (every group's own with a KV layer map).
  [[nodiscard]] planner::KvLayerFormats group_body(int g) const {
    return groups_[static_cast<size_t>(g)].body;
  }
  [[nodiscard]] int layer_group(int il) const { return slots_[static_cast<size_t>(il)].group; }
  [[nodiscard]] int layer_index(int il) const { return slots_[static_cast<size_t>(il)].index; }
  [[nodiscard]] bool has_local_groups() const;
  // Address space every group's pools reserve.
  [[nodiscard]] uint64_t reserved_bytes() const;
  // Bytes of the blocks held by sequences (active blocks of both pools of every group).
  [[nodiscard]] uint64_t held_bytes() const;

  // ---- questions (change nothing) ---------------------------------------------------------
  [[nodiscard]] bool has_sequence(SeqId s) const { return manager().has_sequence(s); }
  // Prompt tokens the prefix cache serves in every group (a multiple of the block size).
  [[nodiscard]] int64_t prefix_hit_tokens(std::span<const int32_t> prompt) const;
  // Whether a new sequence starting with `tokens` fits, its prefix hits counted.
  [[nodiscard]] bool can_start(std::span<const int32_t> tokens) const;
  // Whether `n` more tokens fit for sequence s, which holds `written` tokens' K/V: whether
  // append's plan exists (migrations included). A sequence not started yet: can_start with
  // placeholder tokens (no prefix hits).
  // migrate = false (speculative draft tokens, which may be rolled back): no block leaves the
  // FP16 window for them; the window exits happen with the next append of verified tokens.
  [[nodiscard]] bool can_append(SeqId s, int64_t written, int64_t n, bool migrate = true) const;

  // ---- decisions (their data work appended to `work`) -----------------------------------
  // Appends tokens to s (starting it when new: every group maps the longest prefix all of them
  // serve, FP16 hits needed in the body format are quantised) in pieces up to block boundaries
  // and, between pieces, moves every block that has left the FP16 window to the body pool, so
  // pools planned for a sequence's peak hold any chunking. Returns the tokens served from the
  // prefix cache (new sequences only). Fails, changing nothing, when it does not fit.
  [[nodiscard]] Result<int64_t> append(SeqId s, int64_t written, std::span<const int32_t> tokens,
                                       bool migrate, KvWork& work);
  // After a forward pass over s (`written` tokens stored): every block that has left the FP16
  // window moves to the body pool (partly written per-channel tiles wait), and the blocks of
  // local groups that their sliding window no longer keeps at `written` are dropped.
  // note: call it after a pass of verified tokens only (no draft tokens held), or a rollback
  // could need a dropped block.
  [[nodiscard]] Status finish_pass(SeqId s, int64_t written, KvWork& work);
  // Child shares every block of parent in every group (n > 1 choices, speculative branches).
  [[nodiscard]] Status fork(SeqId parent, SeqId child);
  // Ends s in every group (BlockManager::free).
  [[nodiscard]] Status free(SeqId s);
  // The work handed out so far has run (or was dropped): window-exit sources may give their
  // pages back again (BlockPool::pin).
  void unpin_all();
  // Rolls s back to n tokens in every group (BlockManager::truncate). Fails, changing nothing,
  // where any group refuses, or where a local group already dropped a block its window at n
  // tokens would keep (a rollback further back than the draft tokens).
  [[nodiscard]] Status truncate(SeqId s, int64_t n);
  // BlockManager::mark_computed in every group.
  [[nodiscard]] Status mark_computed(SeqId s, int64_t n);

  // Every manager's invariants, and every group holding the lead's sequences.
  [[nodiscard]] Status check_integrity() const;

 private:
  struct Group {
    std::unique_ptr<BlockManager> mgr;
    int64_t window = 0;  // sliding window of its layers (0: global)
    int n_layers = 0;
    planner::KvLayerFormats body;  // its layers' body formats
  };
  struct LayerSlot {
    int group = 0;
    int index = 0;  // the layer's place within its group's block
  };
  // One group's part of an append: pieces up to block boundaries, and after each piece the
  // logical blocks that leave the FP16 window then (in logical order).
  struct Piece {
    int64_t tokens = 0;
    std::vector<int64_t> exits;
  };
  using AppendPlan = std::vector<Piece>;

  explicit KvCoordinator(const KvCoordinatorConfig& cfg) : cfg_(cfg) {}
  // Group g's plan for an append of n tokens to s (holding `written` tokens); nullopt when the
  // pools cannot hold them with the migrations in between and after the pass. *budget_bytes (a
  // shared budget's bytes left, carried from group to group) is updated.
  [[nodiscard]] std::optional<AppendPlan> plan_append(int g, SeqId s, int64_t written, int64_t n,
                                                      bool migrate, uint64_t* budget_bytes) const;
  // Every group's plan, or nullopt (with the failing group in *failed) when one does not fit.
  [[nodiscard]] std::optional<std::vector<AppendPlan>> plan_all(SeqId s, int64_t written, int64_t n,
                                                                bool migrate,
                                                                int* failed = nullptr) const;
  [[nodiscard]] int64_t prefix_hit_blocks(std::span<const int32_t> prompt) const;
  [[nodiscard]] Result<int64_t> start(SeqId s, std::span<const int32_t> tokens, KvWork& work);
  // Whether a block with `written_rows` of its rows stored may move to the body pool now.
  [[nodiscard]] bool can_migrate_now(int64_t written_rows) const;
  // FP16 -> body move of logical block b of s in group g, its quantisation (of `written`
  // tokens' rows) appended to work.
  [[nodiscard]] Status migrate_block(int g, SeqId s, int64_t b, int64_t written, KvWork& work);
  // Group g's window exits of s as its manager lists them: the moves that may happen now, and
  // with drop also the sliding-window drops at `written` tokens.
  [[nodiscard]] Status move_exits(int g, SeqId s, int64_t written, bool drop, KvWork& work);

  KvCoordinatorConfig cfg_;
  std::vector<Group> groups_;
  std::vector<LayerSlot> slots_;  // [n_layer]
  size_t lead_ = 0;
};

}  // namespace bie::kv
