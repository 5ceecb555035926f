#include "bie/grammar/grammar.h"

#include <fmt/format.h>

#include <optional>

namespace bie::grammar {

Grammar::Sym Grammar::byte_set(const ByteSet& set) {
  auto [it, inserted] = set_ids_.try_emplace(set, static_cast<uint32_t>(sets_.size()));
  if (inserted) sets_.push_back(set);
  return {false, it->second};
}

Grammar::Sym Grammar::byte_range(uint8_t lo, uint8_t hi) {
  ByteSet s{};
  for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
  return byte_set(s);
}

Grammar::Seq Grammar::literal(std::string_view bytes) {
  Seq seq;
  seq.reserve(bytes.size());
  for (char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    seq.push_back(byte_range(b, b));
  }
  return seq;
}

uint32_t Grammar::reserve_rule() {
  rules_.emplace_back();
  defined_.push_back(false);
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::define_rule(uint32_t rule, const std::vector<Seq>& alternatives) {
  // note: call once per reserved rule
  assert(rule < rules_.size() && !defined_[rule]);
  defined_[rule] = true;
  for (const Seq& seq : alternatives) {
    rules_[rule].push_back(static_cast<uint32_t>(elems_.size()));
    for (const Sym& s : seq) elems_.push_back({s.is_rule ? Op::kRule : Op::kChars, s.id});
    elems_.push_back({Op::kEnd, 0});
  }
}

uint32_t Grammar::add_rule(const std::vector<Seq>& alternatives) {
  const uint32_t r = reserve_rule();
  define_rule(r, alternatives);
  return r;
}

Grammar::Seq Grammar::repeat(const Seq& item, int64_t min, int64_t max) {
  Seq out;
  for (int64_t i = 0; i < min; ++i) out.insert(out.end(), item.begin(), item.end());
  if (max < 0) {
    const uint32_t star = reserve_rule();
    Seq more = item;
    more.push_back(ref(star));
    define_rule(star, {more, {}});
    out.push_back(ref(star));
  } else if (max > min) {
    // Nested optionals: tail_k ::= item tail_(k-1) | (empty).
    std::optional<uint32_t> tail;
    for (int64_t k = 0; k < max - min; ++k) {
      Seq more = item;
      if (tail) more.push_back(ref(*tail));
      tail = add_rule({more, {}});
    }
    out.push_back(ref(*tail));
  }
  return out;
}

Status Grammar::check() const {
  if (elems_.size() > kMaxElems) {
    return Error{fmt::format(
        "the schema is too large for grammar-constrained decoding ({} grammar elements, limit {}); "
        "lower maxLength/maxItems or simplify the schema",
        elems_.size(), kMaxElems)};
  }
  if (root_ >= rules_.size()) return Error{"grammar has no root rule"};
  for (size_t r = 0; r < rules_.size(); ++r) {
    if (!defined_[r]) return Error{fmt::format("grammar rule {} was never defined", r)};
  }
  return {};
}

}  // namespace bie::grammar
