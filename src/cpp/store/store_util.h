#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/store/store.h>

// Pieces every Store implementation shares, so that all stores agree on what a counter
// is, on what add() and compareSet() do, and on how their errors read.
namespace ringtree::detail {

// The value add() works on: a decimal int64 with an optional leading '-' ("-12").
// Anything else (empty, spaces, '+', trailing bytes, overflow) is not a counter: nullopt.
std::optional<int64_t> parseCounter(const Bytes& value);

// add()'s rule: the counter under key plus delta, where current is the key's value
// (nullptr: the key is missing, which counts as 0). The caller stores the result's decimal
// text. Throws InvalidArgument "<context>key 'k' does not hold a decimal int64 counter" or
// "<context>key 'k' holds C; adding D overflows int64"; context names the store and the
// call ("HashStore add: "), or is empty where the caller adds it later.
int64_t addToCounter(const std::string& context, const std::string& key, const Bytes* current,
                     int64_t delta);

// compareSet()'s rule: current is the key's value (nullptr: the key is missing). When it
// equals expected, or the key is missing and expected is empty, calls write(desired) and
// returns desired; otherwise writes nothing and returns the current value, or expected for
// a missing key. current is not used after write.
template <typename Write>
Bytes compareSet(const Bytes* current, const Bytes& expected, const Bytes& desired, Write&& write) {
  const bool matches = current == nullptr ? expected.empty() : *current == expected;
  if (!matches) {
    return current == nullptr ? expected : *current;
  }
  std::forward<Write>(write)(desired);
  return desired;
}

// Throws StoreError "<store> <op> timed out after <N> ms; keys not set: [a, b]".
[[noreturn]] void throwWaitTimeout(const std::string& store, const char* op, Store::Timeout timeout,
                                   const std::vector<std::string>& missing);

}  // namespace ringtree::detail
