#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <ringtree/store/store.h>

namespace ringtree {

// A store kept in one file that several processes on hosts sharing a file system open
// by path. Every operation takes an fcntl() lock on the file, so processes and threads
// may use it concurrently.
//
// With worldSize > 0 the file is a one-job rendezvous: each FileStore object registers
// itself (naming its process) when created, and the last of worldSize objects to be
// destroyed removes the file. A file a job that did not finish left behind is recognised
// when the next object registers: if every process registered in it has provably exited
// (same host and pid namespace), the file starts over empty (logged); if some may still
// run and they are worldSize or more, the constructor throws StoreError naming the file
// and those processes. With worldSize <= 0 the file is left in place and nothing is
// registered.
//
// Blocking calls poll the file (with a backoff up to a few milliseconds) until the keys
// appear or the timeout passes.
class RINGTREE_API FileStore : public Store {
 public:
  FileStore(const std::string& path, int worldSize = -1, Timeout timeout = kDefaultTimeout);
  ~FileStore() override;

  const std::string& path() const { return path_; }

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

 private:
  class Impl;
  std::string path_;
  int worldSize_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringtree
