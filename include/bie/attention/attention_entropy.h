// How spiky one query token's attention is over the keys a quantised body holds. The engine's
// spiky-attention fallback (--kv-fallback-entropy, docs/kv-quality.md "Spiky attention") measures
// it at a prompt's last token, where the request is about to answer: a head that puts its weight
// on a few body keys depends on exactly the values a 4-bit body rounds, while weight on the FP16
// sink and window keys is safe, and weight spread over many body keys averages their rounding
// out. Cost: one extra score pass of one query row per layer (no V read), about half of one decode
// step's attention.
#pragma once

#include <cstdint>
#include <span>

#include "bie/backend/kv_block_view.h"
#include "bie/kv/kv_cache.h"

namespace bie::attention {

// One query head's attention at one token, split by where its keys are stored.
struct HeadEntropy {
  // Shannon entropy of the head's weights restricted to keys in quantised blocks (K or V not f16)
  // and renormalised over them, divided by ln(their count): 0 = all on one key, 1 = uniform; 1 when
  // fewer than two such keys are visible.
  float body_entropy = 1.0f;
  float body_mass = 0.0f;  // the share of the head's weight on those keys, 0..1
};

// For each query head h (n_head of them, GQA groups over g.n_head_kv), softmax(scale * q_h . k_j)
// over the keys j the query at position `pos` sees (j <= pos, and pos - j < window when
// window > 0), summarised into out[h]. Scores use the stored keys (the format's scalar dot; the
// queries rotated when the keys were), sums in double.
// q: [n_head, head_dim].
// note: call only with blocks covering positions [0, pos], n_head a multiple of n_head_kv
void attention_entropy(const kv::HostKvBlocks& blocks, const KvGeometry& g, int64_t pos,
                       const float* q, int n_head, float scale, int64_t window, HeadEntropy* out);

// One request's figure from its heads (every layer's): the body entropy averaged with the body
// masses as weights, sum(mass * entropy) / sum(mass); 1 when no weight reaches a quantised key.
// Low = the attention that reaches the quantised body sits on few keys.
[[nodiscard]] double entropy_proxy(std::span<const HeadEntropy> heads);

}  // namespace bie::attention
