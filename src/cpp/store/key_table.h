#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <ringtree/store/store.h>

namespace ringtree {

// The TCPStore server's key-value map and the requests parked on keys that do not exist
// yet, shared by both protocols the server speaks, so that a key means the same to every
// client. Loop-thread only (not thread-safe).
//
// Writes return nothing about waiters: the server re-checks the requests parked on a key
// (takeParked) after every write to it.
class KeyTable {
 public:
  // The value of key, or nullptr when it does not exist.
  const Bytes* find(const std::string& key) const;

  void set(const std::string& key, Bytes value);
  void append(const std::string& key, const Bytes& value);

  // add()'s rule (detail::addToCounter); throws InvalidArgument (no context in the text)
  // when the value is not a counter or the sum overflows. Stores the sum's decimal text.
  int64_t add(const std::string& key, int64_t delta);

  // compareSet()'s rule (detail::compareSet): the value stored afterwards, or the current
  // one when nothing was written. *written says whether it wrote.
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired, bool* written);

  // Whether the key existed.
  bool erase(const std::string& key);

  size_t size() const { return data_.size(); }

  // The first key of keys that does not exist, or nullptr when all do.
  const std::string* firstMissing(const std::vector<std::string>& keys) const;

  // The request of connection id waits for key to be written.
  void park(const std::string& key, uint64_t id);
  // Forgets that connection id waits for key (nothing when it does not).
  void unpark(const std::string& key, uint64_t id);
  // The connections parked on key, which are no longer parked.
  std::vector<uint64_t> takeParked(const std::string& key);

  // Drops every key and every parked request.
  void clear();

 private:
  std::unordered_map<std::string, Bytes> data_;
  // Missing key -> connections whose request waits for it.
  std::unordered_map<std::string, std::vector<uint64_t>> parked_;
};

}  // namespace ringtree
