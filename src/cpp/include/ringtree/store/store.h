#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ringtree/export.h>

namespace ringtree {

using Bytes = std::vector<uint8_t>;

// A key-value store that the ranks of a job use to find each other (rendezvous) and to
// exchange small amounts of metadata. It is not a data path.
//
// Semantics follow torch.distributed's Store:
//  - Values are opaque bytes. add() stores a decimal integer as its value (get() of a
//    counter returns e.g. "5"); add() on a key holding anything else throws InvalidArgument.
//  - get() and wait() block until every key exists or the store's timeout (or the given
//    one) passes, then throw StoreError naming the keys and the timeout.
//  - A timeout of zero means "do not wait": get()/wait() check once and throw at once if a
//    key is missing. Negative timeouts are rejected with InvalidArgument.
//
// Threading: every method may be called from any thread concurrently on the same object.
// Blocking methods hold no lock while they wait.
class RINGTREE_API Store {
 public:
  using Timeout = std::chrono::milliseconds;
  // The default used when none is given (torch's TCPStore default: 300 s).
  static constexpr Timeout kDefaultTimeout = std::chrono::seconds(300);

  explicit Store(Timeout timeout = kDefaultTimeout);
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets key to value, replacing any previous value, and wakes waiters on key.
  virtual void set(const std::string& key, const Bytes& value) = 0;

  // Returns key's value, waiting up to timeout() for it to be set.
  virtual Bytes get(const std::string& key) = 0;

  // Atomically adds delta to the integer stored at key (a missing key counts as 0) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically: if key holds expected (or is missing and expected is empty), sets it to
  // desired. Returns the value stored afterwards; for a missing key with a non-empty
  // expected value, returns expected and stores nothing (torch's behaviour).
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;

  // True if every key exists right now. Never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Waits until every key exists, up to the given timeout (or timeout()).
  void wait(const std::vector<std::string>& keys);
  virtual void wait(const std::vector<std::string>& keys, Timeout timeout) = 0;

  // Blocks until worldSize callers (any processes, this one included) have called
  // barrier with key, up to the given timeout (or timeout()); then StoreError as wait().
  // Uses the keys key + "/num_members" (a counter) and key + "/last_member", as torch's
  // Store.barrier does; a key serves one barrier.
  void barrier(const std::string& key, int64_t worldSize);
  void barrier(const std::string& key, int64_t worldSize, Timeout timeout);

  // Removes key; returns whether it existed.
  virtual bool deleteKey(const std::string& key) = 0;

  // Number of keys held (by this store's view: a PrefixStore counts the whole store).
  virtual int64_t numKeys() = 0;

  // Appends value to key's value, creating the key if missing.
  virtual void append(const std::string& key, const Bytes& value) = 0;

  // get() of several keys in one call (one timeout for all); values in key order.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys);

  // set() of several keys; keys.size() must equal values.size().
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

  // A new object over the same keys and values that another thread may use at the same
  // time as this one without waiting behind its requests: HashStore shares the map,
  // FileStore opens the same file, TcpStore makes its own connection to the same server
  // (with the same shared secret), PrefixStore keeps its prefix over a clone of its
  // underlying store. The clone starts with this store's timeout and is independent
  // afterwards (setTimeout on one does not change the other). Throws what the
  // constructor of the store throws (TcpStore: NetworkError when the server cannot be
  // reached within the timeout).
  virtual std::shared_ptr<Store> clone() = 0;

  // The timeout used by get() and wait() without an explicit one.
  Timeout timeout() const { return Timeout(timeoutMs_.load()); }
  // Throws InvalidArgument for a negative timeout.
  virtual void setTimeout(Timeout timeout);

 private:
  std::atomic<int64_t> timeoutMs_;
};

// Helpers to use std::string values (handy in C++; bytes are copied).
RINGTREE_API Bytes toBytes(const std::string& s);
RINGTREE_API std::string toString(const Bytes& b);

}  // namespace ringtree
