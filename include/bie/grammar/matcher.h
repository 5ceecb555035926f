// GrammarMatcher: runs a Grammar as a pushdown automaton over UTF-8 bytes. A State is the set of
// parse stacks still alive (nondeterminism from anyOf and optional parts is kept as several
// stacks, deduplicated); it is plain data, cheap to copy (a few small flat vectors), and owned by
// the caller, one per request. The matcher holds only a reference to the grammar and scratch
// space: one matcher per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "bie/grammar/grammar.h"

namespace bie::grammar {

class GrammarMatcher {
 public:
  // Every stack lives concatenated in `data`; stack i is data[begin(i), ends[i]), bottom first.
  // Each stack's top is a byte-set element (the next byte it needs).
  struct State {
    std::vector<uint32_t> data;
    std::vector<uint32_t> ends;
    bool complete = false;  // the root rule can end here

    [[nodiscard]] size_t n_stacks() const { return ends.size(); }
    // No stack alive and not complete: nothing more can be matched.
    [[nodiscard]] bool dead() const { return ends.empty() && !complete; }
    [[nodiscard]] bool can_continue() const { return !ends.empty(); }
    bool operator==(const State&) const = default;
  };

  // note: `grammar` must have passed check() and must outlive the matcher.
  explicit GrammarMatcher(const Grammar& grammar);

  [[nodiscard]] State initial() const;

  // Advances `in` by one byte into `out` (cleared first; its capacity is reused). Returns false
  // when the byte is rejected (out is then dead).
  bool advance(const State& in, uint8_t byte, State& out) const;

  // `state` after `bytes`, or nullopt if some byte is rejected.
  [[nodiscard]] std::optional<State> accepts(const State& state, std::string_view bytes) const;

  [[nodiscard]] static bool is_complete(const State& state) { return state.complete; }

  [[nodiscard]] const Grammar& grammar() const { return g_; }

  // Caps that keep a pathological grammar bounded (never reached by the schema compiler's
  // grammars): rule-expansion depth and stacks per state.
  static constexpr int kMaxExpandDepth = 256;
  static constexpr size_t kMaxStacks = 4096;
  static constexpr int kMaxExpandSteps = 1 << 16;  // per advance(): no exponential expansion

 private:
  void expand(std::vector<uint32_t>& stack, State& out, int depth) const;
  static void push_unique(const std::vector<uint32_t>& stack, State& out);

  const Grammar& g_;
  mutable std::vector<uint32_t> work_;  // scratch stack for advance()
  mutable int steps_ = 0;               // expansion steps in this advance()
};

}  // namespace bie::grammar
