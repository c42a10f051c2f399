#include "store/key_table.h"

#include <algorithm>
#include <utility>

#include "store/store_util.h"

namespace ringtree {

const Bytes* KeyTable::find(const std::string& key) const {
  const auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

void KeyTable::set(const std::string& key, Bytes value) { data_[key] = std::move(value); }

void KeyTable::append(const std::string& key, const Bytes& value) {
  Bytes& stored = data_[key];
  stored.insert(stored.end(), value.begin(), value.end());
}

int64_t KeyTable::add(const std::string& key, int64_t delta) {
  const int64_t sum = detail::addToCounter("", key, find(key), delta);
  data_[key] = toBytes(std::to_string(sum));
  return sum;
}

Bytes KeyTable::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired, bool* written) {
  *written = false;
  return detail::compareSet(find(key), expected, desired, [&](const Bytes& value) {
    data_[key] = value;
    *written = true;
  });
}

bool KeyTable::erase(const std::string& key) { return data_.erase(key) > 0; }

const std::string* KeyTable::firstMissing(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (data_.find(key) == data_.end()) return &key;
  }
  return nullptr;
}

void KeyTable::park(const std::string& key, uint64_t id) { parked_[key].push_back(id); }

void KeyTable::unpark(const std::string& key, uint64_t id) {
  const auto it = parked_.find(key);
  if (it == parked_.end()) return;
  auto& ids = it->second;
  ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
  if (ids.empty()) parked_.erase(it);
}

std::vector<uint64_t> KeyTable::takeParked(const std::string& key) {
  const auto it = parked_.find(key);
  if (it == parked_.end()) return {};
  std::vector<uint64_t> ids = std::move(it->second);
  parked_.erase(it);
  return ids;
}

void KeyTable::clear() {
  data_.clear();
  parked_.clear();
}

}  // namespace ringtree
