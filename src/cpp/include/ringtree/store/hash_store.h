#pragma once

#include <memory>

#include <ringtree/store/store.h>

namespace ringtree {

// An in-process store: all users share one object, or clones of it (threads of one
// process). Useful for tests and for single-process jobs.
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
  std::shared_ptr<Store> clone() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;

 private:
  struct State;  // the map, its mutex and its condition variable; shared by clones
  HashStore(std::shared_ptr<State> state, Timeout timeout);

  std::shared_ptr<State> state_;
};

}  // namespace ringtree
