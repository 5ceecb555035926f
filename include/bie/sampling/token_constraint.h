// TokenConstraint: what the Sampler needs from a structured-output constraint (a grammar),
// without depending on how it is computed. Implemented by grammar::GrammarConstraint. Per
// request and stateful (it holds scratch space): not thread-safe.
#pragma once

#include <cstdint>

namespace bie {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether `token` may come next. Cheap: walks one token's bytes.
  [[nodiscard]] virtual bool allows(int32_t token) = 0;
  // Sets the logit of every token that may not come next to -infinity (a walk over the
  // whole vocabulary: the expensive path, taken only when the sampled token was rejected).
  virtual void mask_logits(float* logits, int32_t n_vocab) = 0;
};

}  // namespace bie
