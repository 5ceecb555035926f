#include "tokenizer/spm_model.h"

#include <algorithm>
#include <queue>

#include "tokenizer/unicode.h"

namespace bie::tokenizer {

void SpmModel::encode(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  struct Symbol {
    int32_t prev, next;
    uint32_t begin, len;  // bytes of `text`
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t len;  // bytes of left + right when queued; a mismatch marks a stale entry
  };
  struct Worse {  // highest score first, then leftmost
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  std::vector<Symbol> syms;
  syms.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len =
        std::min(unicode::seq_len_from_lead(static_cast<uint8_t>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(syms.size());
    off += len;
    syms.push_back({idx - 1, off == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off - len),
                    static_cast<uint32_t>(len)});
  }

  std::priority_queue<Bigram, std::vector<Bigram>, Worse> queue;
  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    const TokenId id = vocab_.find(text.substr(syms[l].begin, len));
    if (id == kNoToken) return;
    queue.push({vocab_.score(id), l, r, len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  // Every merged symbol is a token; a single character may not be, and is spelled in bytes.
  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].begin, syms[i].len);
    if (const TokenId id = vocab_.find(piece); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      if (const TokenId id = vocab_.byte_token(static_cast<uint8_t>(c)); id != kNoToken) {
        out.push_back(id);
      }
    }
  }
}

}  // namespace bie::tokenizer
