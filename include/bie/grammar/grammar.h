// Grammar: a context-free grammar over bytes, stored flat for the pushdown matcher (GBNF-like:
// each rule is a list of alternatives, each alternative a sequence of byte sets and rule
// references ended by kEnd). Built once per schema, then immutable and shared by every matcher
// of a request; building is not thread-safe, reading is.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string_view>
#include <vector>

#include "bie/common/result.h"

namespace bie::grammar {

// 256 bits: which byte values a terminal accepts.
using ByteSet = std::array<uint64_t, 4>;

class Grammar {
 public:
  enum class Op : uint8_t { kChars, kRule, kEnd };
  struct Elem {
    Op op = Op::kEnd;
    uint32_t arg = 0;  // kChars: byte-set id; kRule: rule id
  };
  // A symbol while building: a byte set or a rule.
  struct Sym {
    bool is_rule = false;
    uint32_t id = 0;
  };
  using Seq = std::vector<Sym>;

  // Limits that keep a hostile schema from building a huge grammar.
  static constexpr size_t kMaxElems = 400'000;

  [[nodiscard]] Sym byte_range(uint8_t lo, uint8_t hi);
  [[nodiscard]] Sym byte_set(const ByteSet& set);
  [[nodiscard]] Seq literal(std::string_view bytes);

  // A rule id to be defined later (for forward references and recursion).
  [[nodiscard]] uint32_t reserve_rule();
  void define_rule(uint32_t rule, const std::vector<Seq>& alternatives);
  [[nodiscard]] uint32_t add_rule(const std::vector<Seq>& alternatives);
  [[nodiscard]] static Sym ref(uint32_t rule) { return {true, rule}; }
  // `item` repeated min..max times (max < 0: unbounded) as right-recursive rules, so the
  // matcher's stacks do not grow with the count. note: the caller bounds min and max.
  [[nodiscard]] Seq repeat(const Seq& item, int64_t min, int64_t max);
  void set_root(uint32_t rule) { root_ = rule; }

  // Every reserved rule defined, the root set, the size under kMaxElems.
  [[nodiscard]] Status check() const;

  [[nodiscard]] uint32_t root() const { return root_; }
  [[nodiscard]] const Elem& elem(uint32_t pos) const { return elems_[pos]; }
  [[nodiscard]] const std::vector<uint32_t>& alternatives(uint32_t rule) const {
    return rules_[rule];
  }
  [[nodiscard]] bool set_has(uint32_t set, uint8_t byte) const {
    return (sets_[set][byte >> 6] >> (byte & 63)) & 1u;
  }
  [[nodiscard]] size_t n_elems() const { return elems_.size(); }
  [[nodiscard]] size_t n_rules() const { return rules_.size(); }

 private:
  std::vector<Elem> elems_;
  std::vector<std::vector<uint32_t>> rules_;  // per rule: start position of each alternative
  std::vector<bool> defined_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_ids_;  // interning, so equal sets share one id
  uint32_t root_ = UINT32_MAX;
};

}  // namespace bie::grammar
