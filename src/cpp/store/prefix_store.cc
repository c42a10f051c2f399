#include <ringtree/store/prefix_store.h>

#include <utility>

#include <ringtree/error.h>

namespace ringtree {

namespace {
const Store& requireStore(const std::shared_ptr<Store>& store) {
  if (store == nullptr) {
    throw InvalidArgument("PrefixStore: the underlying store must not be null");
  }
  return *store;
}
}  // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(requireStore(store).timeout()), prefix_(std::move(prefix)), store_(std::move(store)) {}

PrefixStore::~PrefixStore() = default;

std::string PrefixStore::withPrefix(const std::string& key) const { return prefix_ + "/" + key; }

std::vector<std::string> PrefixStore::withPrefix(const std::vector<std::string>& keys) const {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) {
    prefixed.push_back(withPrefix(key));
  }
  return prefixed;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  store_->set(withPrefix(key), value);
}

Bytes PrefixStore::get(const std::string& key) { return store_->get(withPrefix(key)); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(withPrefix(key), delta);
}

Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return store_->compareSet(withPrefix(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(withPrefix(keys));
}

void PrefixStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  store_->wait(withPrefix(keys), timeout);
}

bool PrefixStore::deleteKey(const std::string& key) { return store_->deleteKey(withPrefix(key)); }

int64_t PrefixStore::numKeys() { return store_->numKeys(); }

void PrefixStore::append(const std::string& key, const Bytes& value) {
  store_->append(withPrefix(key), value);
}

std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  return store_->multiGet(withPrefix(keys));
}

void PrefixStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  store_->multiSet(withPrefix(keys), values);
}

std::shared_ptr<Store> PrefixStore::clone() { return std::make_shared<PrefixStore>(prefix_, store_->clone()); }

void PrefixStore::setTimeout(Timeout timeout) {
  // Validates (negative: InvalidArgument) before the underlying store is touched.
  Store::setTimeout(timeout);
  store_->setTimeout(timeout);
}

}  // namespace ringtree
