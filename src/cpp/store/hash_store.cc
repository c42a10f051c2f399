#include <ringtree/store/hash_store.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

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

}  // namespace

struct HashStore::State {
  std::mutex mutex;
  std::condition_variable changed;
  Map map;
};

HashStore::HashStore(Timeout timeout) : HashStore(std::make_shared<State>(), timeout) {}

HashStore::HashStore(std::shared_ptr<State> state, Timeout timeout) : Store(timeout), state_(std::move(state)) {}

std::shared_ptr<Store> HashStore::clone() { return std::shared_ptr<HashStore>(new HashStore(state_, timeout())); }

HashStore::~HashStore() = default;

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->map[key] = value;
  }
  state_->changed.notify_all();
}

Bytes HashStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  waitForKeys(lock, state_->changed, state_->map, {key}, timeout(), "get");
  return state_->map.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto it = state_->map.find(key);
    result = detail::addToCounter("HashStore add: ", key, it == state_->map.end() ? nullptr : &it->second, delta);
    state_->map[key] = toBytes(std::to_string(result));
  }
  state_->changed.notify_all();
  return result;
}

Bytes HashStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  bool written = false;
  Bytes result;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto it = state_->map.find(key);
    result = detail::compareSet(it == state_->map.end() ? nullptr : &it->second, expected, desired,
                                [&](const Bytes& value) {
                                  state_->map[key] = value;
                                  written = true;
                                });
  }
  if (written) {
    state_->changed.notify_all();
  }
  return result;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return hasAll(state_->map, keys);
}

void HashStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  requireValidTimeout(timeout);
  std::unique_lock<std::mutex> lock(state_->mutex);
  waitForKeys(lock, state_->changed, state_->map, keys, timeout, "wait");
}

bool HashStore::deleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->map.erase(key) != 0;
}

int64_t HashStore::numKeys() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->map.size());
}

void HashStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    Bytes& stored = state_->map[key];
    stored.insert(stored.end(), value.begin(), value.end());
  }
  state_->changed.notify_all();
}

std::vector<Bytes> HashStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  waitForKeys(lock, state_->changed, state_->map, keys, timeout(), "multi_get");
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) {
    values.push_back(state_->map.at(key));
  }
  return values;
}

}  // namespace ringtree
