#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ringtree/store/store.h>

// Pieces every Store implementation shares, so that all stores agree on what a counter
// is and on how a timeout reads.
namespace ringtree::detail {

// The value add() works on: a decimal int64 with an optional leading '-' ("-12").
// Anything else (empty, spaces, '+', trailing bytes, overflow) is not a counter: nullopt.
std::optional<int64_t> parseCounter(const Bytes& value);

// Throws StoreError "<store> <op> timed out after <N> ms; keys not set: [a, b]".
[[noreturn]] void throwWaitTimeout(const std::string& store, const char* op, Store::Timeout timeout,
                                   const std::vector<std::string>& missing);

}  // namespace ringtree::detail
