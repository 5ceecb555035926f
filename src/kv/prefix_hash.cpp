#include "bie/kv/prefix_hash.h"

// Stack-allocated streaming state (the struct is public only in the static-linking section).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>

namespace bie::kv {

uint64_t prefix_root_hash(std::string_view model_id) {
  // A fixed domain tag keeps the root apart from any chain hash of real tokens.
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  static constexpr char kTag[] = "bie-kv-prefix-root-v1";
  XXH3_64bits_update(&st, kTag, sizeof kTag - 1);
  XXH3_64bits_update(&st, model_id.data(), model_id.size());
  return XXH3_64bits_digest(&st);
}

uint64_t prefix_chain_hash(uint64_t parent, std::span<const int32_t> tokens) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, &parent, sizeof parent);
  XXH3_64bits_update(&st, tokens.data(), tokens.size_bytes());
  return XXH3_64bits_digest(&st);
}

uint64_t prefix_block_key(uint64_t chain, planner::KvFormat k, planner::KvFormat v) {
  unsigned char buf[8 + 4 * 4];
  std::memcpy(buf, &chain, 8);
  const int32_t f[4] = {static_cast<int32_t>(k.type), k.group, static_cast<int32_t>(v.type),
                        v.group};
  std::memcpy(buf + 8, f, sizeof f);
  return XXH3_64bits(buf, sizeof buf);
}

}  // namespace bie::kv
