#include <ringtree/store/hash_store.h>

#include <algorithm>

#include <ringtree/error.h>

#include "store/store_util.h"

namespace ringtree {

namespace {

using Clock = std::chrono::steady_clock;
using Map = std::unordered_map<std::string, Bytes>;

// Longer timeouts are clamped to this, so that now() + timeout cannot overflow.
constexpr Store::Timeout kLongestWait = std::chrono::hours(24 * 365 * 100);

void requireValidTimeout(Store::Timeout timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument("HashStore: timeout must be >= 0 ms, got " +
                          std::to_string(timeout.count()) + " ms");
  }
}

bool hasAll(const Map& map, const std::vector<std::string>& keys) {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return map.count(key) != 0; });
}

// Blocks on changed (releasing lock while it waits) until every key is in map. Throws
// StoreError naming the missing keys and the timeout when it passes first; a zero timeout
// checks once.
void waitForKeys(std::unique_lock<std::mutex>& lock, std::condition_variable& changed,
                 const Map& map, const std::vector<std::string>& keys, Store::Timeout timeout,
                 const char* op) {
  const auto deadline = Clock::now() + std::min(timeout, kLongestWait);
  if (changed.wait_until(lock, deadline, [&] { return hasAll(map, keys); })) {
    return;
  }
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (map.count(key) == 0) {
      missing.push_back(key);
    }
  }
  detail::throwWaitTimeout("HashStore", op, timeout, missing);
}

// The value add() adds to: a decimal int64 ("-12"), nothing else.
int64_t parseCounter(const std::string& key, const Bytes& value) {
  const auto counter = detail::parseCounter(value);
  if (!counter) {
    throw InvalidArgument("HashStore: add on key '" + key +
                          "', whose value is not a decimal int64 counter");
  }
  return *counter;
}

}  // namespace

HashStore::HashStore(Timeout timeout) : Store(timeout) {}

HashStore::~HashStore() = default;

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitForKeys(lock, changed_, map_, {key}, timeout(), "get");
  return map_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = map_.find(key);
    const int64_t current = it == map_.end() ? 0 : parseCounter(key, it->second);
    if (__builtin_add_overflow(current, delta, &result)) {
      throw InvalidArgument("HashStore: add of " + std::to_string(delta) + " to key '" + key +
                            "' (" + std::to_string(current) + ") overflows int64");
    }
    map_[key] = toBytes(std::to_string(result));
  }
  changed_.notify_all();
  return result;
}

Bytes HashStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = map_.find(key);
  if (it == map_.end() && !expected.empty()) {
    return expected;
  }
  if (it != map_.end() && it->second != expected) {
    return it->second;
  }
  map_[key] = desired;
  lock.unlock();
  changed_.notify_all();
  return desired;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return hasAll(map_, keys);
}

void HashStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  requireValidTimeout(timeout);
  std::unique_lock<std::mutex> lock(mutex_);
  waitForKeys(lock, changed_, map_, keys, timeout, "wait");
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.erase(key) != 0;
}

int64_t HashStore::numKeys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

void HashStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Bytes& stored = map_[key];
    stored.insert(stored.end(), value.begin(), value.end());
  }
  changed_.notify_all();
}

std::vector<Bytes> HashStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitForKeys(lock, changed_, map_, keys, timeout(), "multi_get");
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    values.push_back(map_.at(key));
  }
  return values;
}

}  // namespace ringtree
