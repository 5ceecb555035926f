#include "tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "tokenizer/unicode.h"

namespace bie::tokenizer {

Result<std::unique_ptr<BpeModel>> BpeModel::create(const Vocab& vocab) {
  if (vocab.kind() != VocabKind::kBpe) return Error{"BpeModel: vocabulary is not BPE"};
  auto pre = PreTokenizer::create(vocab.pre());
  if (!pre.ok()) return Error{pre.error()};
  std::unique_ptr<BpeModel> m(new BpeModel(vocab, std::move(pre.value())));

  const int32_t n_tokens = vocab.n_tokens();
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> extra_index;
  const auto intern = [&](std::string_view text) -> int32_t {
    if (const TokenId id = vocab.find(text); id != kNoToken) return id;
    if (auto it = extra_index.find(text); it != extra_index.end()) return it->second;
    const auto sym = static_cast<int32_t>(n_tokens + m->extra_texts_.size());
    m->extra_texts_.emplace_back(text);
    extra_index.emplace(std::string(text), sym);
    return sym;
  };

  const auto& merges = vocab.data().merges;
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& line = merges[rank];
    // llama.cpp splits at the first space after the first byte; a line without one is ignored.
    const size_t sp = line.find(' ', 1);
    if (sp == std::string::npos) continue;
    const std::string_view left(line.data(), sp);
    const std::string_view right(line.data() + sp + 1, line.size() - sp - 1);
    const int32_t l = intern(left);
    const int32_t r = intern(right);
    const int32_t res = intern(std::string(left) + std::string(right));
    // The first occurrence of a pair keeps its rank (llama.cpp uses emplace).
    m->merges_.emplace(key(l, r), Merge{static_cast<int32_t>(rank), res});
  }
  for (int b = 0; b < 256; ++b) {
    const std::string& t = unicode::byte_to_unicode(static_cast<uint8_t>(b));
    const TokenId id = vocab.find(t);
    if (id != kNoToken) {
      m->byte_sym_[b] = id;
    } else if (auto it = extra_index.find(t); it != extra_index.end()) {
      m->byte_sym_[b] = it->second;
    } else {
      m->byte_sym_[b] = -1;  // cannot take part in any merge
    }
  }
  return m;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  const auto it = merges_.find(key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::emit(int32_t sym, std::string_view raw, std::vector<TokenId>& out) const {
  if (sym >= 0 && sym < vocab_.n_tokens()) {
    out.push_back(sym);
    return;
  }
  // Not a token: llama.cpp looks up each byte of the mapped text on its own and drops misses.
  std::string mapped;
  for (char c : raw) mapped += unicode::byte_to_unicode(static_cast<uint8_t>(c));
  for (char c : mapped) {
    if (const TokenId id = vocab_.find(std::string_view(&c, 1)); id != kNoToken) out.push_back(id);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (vocab_.data().ignore_merges) {
    std::string mapped;
    for (char c : word) mapped += unicode::byte_to_unicode(static_cast<uint8_t>(c));
    if (const TokenId id = vocab_.find(mapped); id != kNoToken) {
      out.push_back(id);
      return;
    }
  }

  struct Symbol {
    int32_t sym;
    int32_t prev, next;
    uint32_t begin, len;  // raw bytes of the word
  };
  struct Bigram {
    int32_t rank;
    int32_t left, right;          // symbol indices
    int32_t left_sym, right_sym;  // their ids when queued, to detect stale entries
  };
  struct Later {  // lowest rank first, then leftmost
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> syms(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    syms[i] = {byte_sym_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1,
               static_cast<uint32_t>(i), 1};
  }
  std::vector<Bigram> heap_storage;
  heap_storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Bigram, std::vector<Bigram>, Later> queue(Later{}, std::move(heap_storage));
  const auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (const Merge* m = find_merge(syms[l].sym, syms[r].sym)) {
      queue.push({m->rank, l, r, syms[l].sym, syms[r].sym});
    }
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.sym != b.left_sym || r.sym != b.right_sym) continue;
    l.sym = find_merge(l.sym, r.sym)->result;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int32_t i = 0; i != -1; i = syms[i].next) {
    emit(syms[i].sym, word.substr(syms[i].begin, syms[i].len), out);
  }
}

void BpeModel::encode(std::string_view text, std::vector<TokenId>& out) const {
  std::string normalized;
  std::vector<std::pair<size_t, size_t>> words;
  pre_.split(text, normalized, words);
  std::vector<TokenId> ids;
  for (const auto& [begin, end] : words) {
    const std::string_view word(normalized.data() + begin, end - begin);
    if (word.size() > kMaxCachedWordBytes) {
      encode_word(word, out);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (const auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    ids.clear();
    encode_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(word), ids);
  }
}

size_t BpeModel::cache_size() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return cache_.size();
}

}  // namespace bie::tokenizer
