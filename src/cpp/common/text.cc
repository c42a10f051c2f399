#include "common/text.h"

#include <charconv>
#include <system_error>

namespace ringtree::text {

std::string rankList(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return text;
}

bool parseInteger(std::string_view text, int64_t min, int64_t max, int64_t* value) {
  int64_t parsed = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, parsed);
  if (text.empty() || error != std::errc() || stop != end || parsed < min || parsed > max) return false;
  *value = parsed;
  return true;
}

}  // namespace ringtree::text
