// Prefix-cache hashing (xxh3_64). A block's *chain* hash identifies its content: the parent
// block's chain hash, its B token ids and the model. Its *key* adds the storage format, so the
// same tokens stored in FP16 and in a body format are different cache entries. Pure functions;
// thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "bie/planner/kv_format.h"

namespace bie::kv {

// Chain hash of the (virtual) block before block 0: a hash of the model id, so two models never
// share entries.
[[nodiscard]] uint64_t prefix_root_hash(std::string_view model_id);

// hash(parent chain hash, token ids). The model id enters through the root.
[[nodiscard]] uint64_t prefix_chain_hash(uint64_t parent, std::span<const int32_t> tokens);

// hash(chain hash, K format, V format): the lookup key of a block stored in that format.
[[nodiscard]] uint64_t prefix_block_key(uint64_t chain, planner::KvFormat k, planner::KvFormat v);

}  // namespace bie::kv
