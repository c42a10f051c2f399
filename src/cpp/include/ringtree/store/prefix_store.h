#pragma once

#include <memory>
#include <string>

#include <ringtree/store/store.h>

namespace ringtree {

// A view of another store in which every key is prefixed with "<prefix>/". Several
// groups share one underlying store this way without their keys meeting.
// numKeys() reports the underlying store's count (as torch's PrefixStore does).
// The timeout is the underlying store's: setTimeout() forwards to it.
class RINGTREE_API PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  ~PrefixStore() override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlyingStore() const { return store_; }

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
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void setTimeout(Timeout timeout) override;

 private:
  std::string withPrefix(const std::string& key) const;
  std::vector<std::string> withPrefix(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
};

}  // namespace ringtree
