#include <ringtree/store/store.h>

#include <charconv>

#include <ringtree/error.h>

#include "store/store_util.h"

namespace ringtree {

namespace {
int64_t checkedTimeout(Store::Timeout timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument("store timeout must be >= 0 ms, got " + std::to_string(timeout.count()) + " ms");
  }
  return timeout.count();
}
}  // namespace

Store::Store(Timeout timeout) : timeoutMs_(checkedTimeout(timeout)) {}

Store::~Store() = default;

void Store::wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

void Store::barrier(const std::string& key, int64_t worldSize) { barrier(key, worldSize, timeout()); }

void Store::barrier(const std::string& key, int64_t worldSize, Timeout timeout) {
  if (worldSize < 1) {
    throw InvalidArgument("Store barrier '" + key + "': world_size must be at least 1, got " + std::to_string(worldSize));
  }
  const std::string lastMember = key + "/last_member";
  if (add(key + "/num_members", 1) == worldSize) set(lastMember, toBytes("1"));
  wait({lastMember}, timeout);
}

std::vector<Bytes> Store::multiGet(const std::vector<std::string>& keys) {
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    values.push_back(get(key));
  }
  return values;
}

void Store::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size()) {
    throw InvalidArgument("multi_set: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    set(keys[i], values[i]);
  }
}

void Store::setTimeout(Timeout timeout) { timeoutMs_.store(checkedTimeout(timeout)); }

Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

namespace detail {

std::optional<int64_t> parseCounter(const Bytes& value) {
  const auto* first = reinterpret_cast<const char*>(value.data());
  const auto* last = first + value.size();
  int64_t result = 0;
  const auto [end, ec] = std::from_chars(first, last, result);
  if (value.empty() || ec != std::errc() || end != last) {
    return std::nullopt;
  }
  return result;
}

int64_t addToCounter(const std::string& context, const std::string& key, const Bytes* current,
                     int64_t delta) {
  const auto counter = current == nullptr ? std::optional<int64_t>(0) : parseCounter(*current);
  if (!counter) {
    throw InvalidArgument(context + "key '" + key + "' does not hold a decimal int64 counter");
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(*counter, delta, &sum)) {
    throw InvalidArgument(context + "key '" + key + "' holds " + std::to_string(*counter) + "; adding " +
                          std::to_string(delta) + " overflows int64");
  }
  return sum;
}

void throwWaitTimeout(const std::string& store, const char* op, Store::Timeout timeout,
                      const std::vector<std::string>& missing) {
  std::string keys;
  for (const auto& key : missing) {
    keys += (keys.empty() ? "" : ", ") + key;
  }
  throw StoreError(store + " " + op + " timed out after " + std::to_string(timeout.count()) +
                   " ms; keys not set: [" + keys + "]");
}

}  // namespace detail

}  // namespace ringtree
