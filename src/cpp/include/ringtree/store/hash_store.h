#pragma once

#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include <ringtree/store/store.h>

namespace ringtree {

// An in-process store: all users share one object (threads of one process). Useful for
// tests and for single-process jobs.
class RINGTREE_API HashStore : public Store {
 public:
  explicit HashStore(Timeout timeout = kDefaultTimeout);
  ~HashStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, Bytes> map_;
};

}  // namespace ringtree
