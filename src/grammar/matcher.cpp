#include "bie/grammar/matcher.h"

#include <algorithm>

namespace bie::grammar {

GrammarMatcher::GrammarMatcher(const Grammar& grammar) : g_(grammar) {}

void GrammarMatcher::push_unique(const std::vector<uint32_t>& stack, State& out) {
  // States hold a handful of stacks; a linear scan is cheaper than hashing them.
  uint32_t begin = 0;
  for (uint32_t end : out.ends) {
    if (end - begin == stack.size() &&
        std::equal(stack.begin(), stack.end(), out.data.begin() + begin)) {
      return;
    }
    begin = end;
  }
  if (out.ends.size() >= kMaxStacks) return;  // bounded; see kMaxStacks
  out.data.insert(out.data.end(), stack.begin(), stack.end());
  out.ends.push_back(static_cast<uint32_t>(out.data.size()));
}

// Expands the top of `stack` through rule references and alternative ends until it is a byte
// set (then it is a live stack of `out`) or the stack is empty (the root is complete). `stack` is
// restored before returning.
void GrammarMatcher::expand(std::vector<uint32_t>& stack, State& out, int depth) const {
  if (stack.empty()) {
    out.complete = true;
    return;
  }
  // Caps for a left-recursive or exponentially ambiguous grammar; the compilers make neither
  // (a cap only ever drops parses, so the output stays valid).
  if (depth > kMaxExpandDepth || ++steps_ > kMaxExpandSteps) return;
  const uint32_t pos = stack.back();
  const Grammar::Elem& e = g_.elem(pos);
  switch (e.op) {
    case Grammar::Op::kChars:
      push_unique(stack, out);
      return;
    case Grammar::Op::kEnd:
      stack.pop_back();
      expand(stack, out, depth + 1);
      stack.push_back(pos);
      return;
    case Grammar::Op::kRule: {
      stack.pop_back();
      // A reference in tail position leaves no continuation, so right recursion (repetition)
      // does not grow the stack.
      const bool tail = g_.elem(pos + 1).op == Grammar::Op::kEnd;
      if (!tail) stack.push_back(pos + 1);
      for (uint32_t start : g_.alternatives(e.arg)) {
        stack.push_back(start);
        expand(stack, out, depth + 1);
        stack.pop_back();
      }
      if (!tail) stack.pop_back();
      stack.push_back(pos);
      return;
    }
  }
}

GrammarMatcher::State GrammarMatcher::initial() const {
  State s;
  work_.clear();
  steps_ = 0;
  for (uint32_t start : g_.alternatives(g_.root())) {
    work_.push_back(start);
    expand(work_, s, 0);
    work_.pop_back();
  }
  return s;
}

bool GrammarMatcher::advance(const State& in, uint8_t byte, State& out) const {
  out.data.clear();
  out.ends.clear();
  out.complete = false;
  steps_ = 0;
  uint32_t begin = 0;
  for (uint32_t end : in.ends) {
    const uint32_t top = in.data[end - 1];
    if (g_.set_has(g_.elem(top).arg, byte)) {
      work_.assign(in.data.begin() + begin, in.data.begin() + end);
      work_.back() = top + 1;
      expand(work_, out, 0);
    }
    begin = end;
  }
  return !out.dead();
}

std::optional<GrammarMatcher::State> GrammarMatcher::accepts(const State& state,
                                                             std::string_view bytes) const {
  State cur = state, next;
  for (char c : bytes) {
    if (!advance(cur, static_cast<uint8_t>(c), next)) return std::nullopt;
    std::swap(cur, next);
  }
  return cur;
}

}  // namespace bie::grammar
