#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// Small text helpers that error messages and parsers of several layers share.
namespace ringtree::text {

// "rank 3" for one rank, "ranks 1, 4, 5" for several, in the order given. Callers pass
// at least one rank.
std::string rankList(const std::vector<int>& ranks);

// Whether `text` is, in full, a decimal integer in [min, max]: an optional '-' and digits
// only (no sign '+', no spaces). Stores it in *value when it is; leaves *value alone
// otherwise.
bool parseInteger(std::string_view text, int64_t min, int64_t max, int64_t* value);

}  // namespace ringtree::text
