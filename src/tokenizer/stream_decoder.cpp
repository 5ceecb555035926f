#include "bie/tokenizer/stream_decoder.h"

#include "tokenizer/unicode.h"

namespace bie::tokenizer {

namespace {
constexpr std::string_view kReplacementUtf8 = "\xef\xbf\xbd";
}

std::string StreamDecoder::push(TokenId id) {
  const VocabData& d = tok_.vocab().data();
  // Same leading-space and BOS rules as Tokenizer::decode for the first token.
  bool remove_space = false;
  if (first_) {
    first_ = false;
    if (opts_.remove_special && d.add_bos && id == tok_.bos()) return {};
    remove_space = d.add_space_prefix;
  }
  std::string_view piece = tok_.token_to_piece(id, opts_.render_special);
  if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  pending_.append(piece);

  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int k = unicode::classify_sequence(std::string_view(pending_).substr(i));
    if (k == 0) break;  // incomplete: wait for more bytes
    if (k > 0) {
      out.append(pending_, i, static_cast<size_t>(k));
      i += static_cast<size_t>(k);
    } else {
      out.append(kReplacementUtf8);
      i += static_cast<size_t>(-k);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacementUtf8);
  reset();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  first_ = true;
}

}  // namespace bie::tokenizer
