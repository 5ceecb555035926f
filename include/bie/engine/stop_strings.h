// StopStrings: ends generation at the first occurrence of any stop string in the generated text
// (OpenAI's `stop`), which may span tokens. Text that could still turn out to be the start of a
// stop string is held back until it cannot; the stop string itself is never emitted. One per
// request; not thread-safe.
#pragma once
#include <string>
#include <vector>

namespace bie {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  // Adds decoded text; returns what can be emitted now. Sets stopped() on a match (the text
  // before the match is returned; anything after it is dropped).
  [[nodiscard]] std::string push(const std::string& text);
  // End of generation: the held-back text (empty after a match).
  [[nodiscard]] std::string flush();
  [[nodiscard]] bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace bie
