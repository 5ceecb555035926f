// SHA-256 of a model file, the model id that keys the prefix cache and the audit field of every
// response. Hashing an 8B GGUF takes seconds, so the digest is remembered in
// $BIE_HOME/digests/ keyed by the file's canonical path, size, modification time and inode, and
// recomputed when any of them changes. Thread-safe (distinct files; concurrent writers of the
// same record replace it atomically).
#pragma once

#include <string>

#include "bie/common/result.h"

namespace bie {

// The hex digest of the whole file. A cache that cannot be read or written is ignored.
[[nodiscard]] Result<std::string> file_sha256(const std::string& path);
// The same, never using the cache (tests, and what fills it).
[[nodiscard]] Result<std::string> file_sha256_uncached(const std::string& path);

}  // namespace bie
