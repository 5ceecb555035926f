// The id of a sequence in the KV cache: the one KV type that headers above kv/ (engine/sequence.h)
// need without pulling in the block manager. Header-only.
#pragma once

#include <cstdint>

namespace bie::kv {

using SeqId = int64_t;

}  // namespace bie::kv
