// KvEventSink: what the prefix cache reports to the outside world (KV events for prefix-aware
// routers). A BlockManager with a sink calls it on the engine thread for every full block that
// enters its prefix index and for every block that leaves it (evicted for new content, pages
// given back to a shared budget, or forgotten before a rewrite). Implementations must be cheap
// and must not call back into the KV code: queue the event and publish it elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace bie::kv {

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  // A block keyed by its chain hash `chain` (parent chain hash, its tokens, the model) is now
  // findable in the store `medium` (which regime, group and pool holds it). parent: the chain
  // hash of the block before it; none for a sequence's first block.
  virtual void block_stored(std::string_view medium, uint64_t chain, std::optional<uint64_t> parent,
                            std::span<const int32_t> tokens, int block_size) = 0;
  // The block with chain hash `chain` is no longer findable in `medium`.
  virtual void block_removed(std::string_view medium, uint64_t chain) = 0;
};

}  // namespace bie::kv
