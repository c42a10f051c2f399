#include <ringtree/store/store.h>

#include <ringtree/error.h>

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

}  // namespace ringtree
