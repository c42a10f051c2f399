#include <ringtree/store/file_store.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include <ringtree/error.h>

#include "common/logging.h"
#include "common/process_identity.h"
#include "common/socket.h"
#include "store/store_util.h"

namespace ringtree {

namespace {

// File layout (integers little-endian):
//   header: the kHeaderSize bytes of kMagic;
//   then records, each appended whole under the exclusive lock and never rewritten:
//     u8 type | u32 key length | u32 value length | key | value
// kSet replaces the key's value, kAppend appends to it (creating it), kDelete removes it
// (empty value). kRegister and kDeregister (empty key; the value names the registering
// process, common/process_identity.h; empty in files of older versions) track the
// FileStore objects of a worldSize job, for the cleanup and to recognise a file a job
// that did not finish left behind; they are not keys.
constexpr char kMagic[] = "RTFSTOR1";
constexpr size_t kHeaderSize = sizeof(kMagic) - 1;
constexpr size_t kRecordHeaderSize = 9;
enum RecordType : uint8_t { kSet = 1, kAppend = 2, kDelete = 3, kRegister = 4, kDeregister = 5 };

using Clock = std::chrono::steady_clock;
// Blocking calls re-read the file after kFirstPoll, doubling up to kLongestPoll.
constexpr std::chrono::microseconds kFirstPoll(100);
constexpr std::chrono::microseconds kLongestPoll(4000);
// Longer timeouts are clamped to this, so that now() + timeout cannot overflow.
constexpr Store::Timeout kLongestWait = std::chrono::hours(24 * 365 * 100);

uint32_t loadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void storeLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Holds an fcntl() lock on the whole file for its lifetime: exclusive for writers, shared
// for readers. OFD locks belong to the open file description, so two FileStore objects
// exclude each other even inside one process; threads of one object are serialised by
// the object's mutex instead.
class FileLock {
 public:
  FileLock(int fd, const std::string& path, bool exclusive) : fd_(fd) {
    struct flock request {};
    request.l_type = exclusive ? F_WRLCK : F_RDLCK;
    request.l_whence = SEEK_SET;
    while (::fcntl(fd_, F_OFD_SETLKW, &request) != 0) {
      if (errno != EINTR) {
        throw StoreError("FileStore '" + path + "': cannot lock the file: " + net::errnoText(errno));
      }
    }
  }
  ~FileLock() {
    struct flock request {};
    request.l_type = F_UNLCK;
    request.l_whence = SEEK_SET;
    ::fcntl(fd_, F_OFD_SETLK, &request);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

void requireValidTimeout(Store::Timeout timeout) {
  if (timeout.count() < 0) {
    throw InvalidArgument("FileStore: timeout must be >= 0 ms, got " +
                          std::to_string(timeout.count()) + " ms");
  }
}

}  // namespace

// The parsed state of the file plus the descriptor to read more of it. Every member is
// guarded by mutex_; the file itself by FileLock.
class FileStore::Impl {
 public:
  // Opens (creating) the file, writes the header into an empty file, reads the log and,
  // with worldSize > 0, registers this object (see registerIn).
  Impl(const std::string& path, int worldSize) : path_(path) {
    for (;;) {
      Fd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
      if (fd.get() < 0) {
        throw StoreError("FileStore '" + path_ + "': cannot open: " + net::errnoText(errno));
      }
      FileLock lock(fd.get(), path_, true);
      // The last object of a finished job may have removed the file between open() and
      // the lock; open the path again then.
      if (!isAtPath(fd.get())) {
        continue;
      }
      fd_ = std::move(fd);
      if (fileSize() == 0) {
        writeAll(reinterpret_cast<const uint8_t*>(kMagic), kHeaderSize, 0);
      }
      refresh();
      if (worldSize > 0) {
        registerIn(worldSize);
      }
      return;
    }
  }

  // Runs fn with the mutex and the file lock held, after reading what others appended.
  template <typename Fn>
  auto locked(bool exclusive, Fn&& fn) {
    std::lock_guard<std::mutex> guard(mutex_);
    FileLock lock(fd_.get(), path_, exclusive);
    refresh();
    return fn();
  }

  // Re-reads the file until every key exists, then returns onPresent() (run under the
  // locks). Holds no lock between polls. Throws StoreError naming the missing keys and
  // the timeout once it passes; a zero timeout checks once.
  template <typename Fn>
  auto waitFor(const std::vector<std::string>& keys, Store::Timeout timeout, const char* op,
               Fn&& onPresent) {
    const auto deadline = Clock::now() + std::min(timeout, kLongestWait);
    auto poll = kFirstPoll;
    for (;;) {
      {
        std::lock_guard<std::mutex> guard(mutex_);
        FileLock lock(fd_.get(), path_, false);
        refresh();
        if (hasAll(keys)) {
          return onPresent();
        }
        if (Clock::now() >= deadline) {
          detail::throwWaitTimeout("FileStore '" + path_ + "'", op, timeout, missing(keys));
        }
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(poll, deadline - Clock::now()));
      poll = std::min(poll * 2, kLongestPoll);
    }
  }

  // Appends one record and applies it. Needs the exclusive lock and a refresh() since it
  // was taken (so that offset_ is the end of the file).
  void appendRecord(RecordType type, const std::string& key, const Bytes& value) {
    constexpr size_t kMaxField = std::numeric_limits<uint32_t>::max();
    if (key.size() > kMaxField || value.size() > kMaxField) {
      throw InvalidArgument("FileStore '" + path_ + "': key or value of key '" + key +
                            "' exceeds 4 GiB");
    }
    Bytes record(kRecordHeaderSize + key.size() + value.size());
    record[0] = type;
    storeLe32(&record[1], static_cast<uint32_t>(key.size()));
    storeLe32(&record[5], static_cast<uint32_t>(value.size()));
    std::copy(key.begin(), key.end(), record.begin() + kRecordHeaderSize);
    std::copy(value.begin(), value.end(), record.begin() + kRecordHeaderSize + key.size());
    try {
      writeAll(record.data(), record.size(), offset_);
    } catch (const StoreError&) {
      // Keep the log whole: drop whatever part of the record made it to the file.
      if (::ftruncate(fd_.get(), static_cast<off_t>(offset_)) != 0) {
        RINGTREE_WARN("FileStore '" << path_ << "': cannot truncate a partial record: "
                                    << net::errnoText(errno));
      }
      throw;
    }
    apply(record.data(), record.size());
  }

  // Appends kDeregister; the last object of a worldSize job removes the file.
  void deregister(int worldSize) {
    if (std::find(live_.begin(), live_.end(), self_) == live_.end()) {
      RINGTREE_WARN("FileStore '" << path_ << "': this object's registration is gone from the file (was the file "
                                  << "deleted or started over?); leaving the file as it is");
      return;
    }
    appendRecord(kDeregister, {}, toBytes(self_));
    if (live_.empty() && finished_ >= worldSize && isAtPath(fd_.get()) &&
        ::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      RINGTREE_WARN("FileStore '" << path_ << "': cannot remove the file: " << net::errnoText(errno));
    }
  }

  bool hasAll(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& key) { return map_.count(key) != 0; });
  }

  // The key's value, nullptr when it is missing.
  const Bytes* find(const std::string& key) const {
    const auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }

  std::unordered_map<std::string, Bytes> map_;

 private:
  // Registers this object in a job of worldSize, after looking at the registrations
  // still open: a job that did not finish left them when each of their processes is
  // provably gone (same host and pid namespace; no such process now), and the file
  // starts over; when some may still run and the job has no room for another, this is
  // refused at once rather than joining a job that is not this one. Needs the exclusive
  // lock and a refresh().
  void registerIn(int worldSize) {
    if (!live_.empty()) {
      std::string found;
      bool allGone = true;
      for (const std::string& registration : live_) {
        ProcessIdentity identity;
        const bool known = decodeProcessIdentity(registration, &identity);
        const Liveness liveness = known ? livenessOf(identity) : Liveness::kUnknown;
        allGone = allGone && liveness == Liveness::kGone;
        found += (found.empty() ? "" : "; ") + (known ? describeRegistration(identity, liveness)
                                                      : std::string("a process of an older ringtree"));
      }
      if (allGone) {
        RINGTREE_WARN("FileStore '" << path_ << "': starting the file over: it held what a job that did not "
                                    << "finish left (" << found << "), and every process registered in it has exited");
        startOver();
      } else if (static_cast<int64_t>(live_.size()) >= worldSize) {
        throw StoreError("FileStore '" + path_ + "': the file already holds " + std::to_string(live_.size()) +
                         " registrations of a job that has not finished (" + found + "), which leaves no room " +
                         "in a job of world size " + std::to_string(worldSize) + ": another job is using this " +
                         "file, or one that did not finish left it behind. Use another path, or delete the file " +
                         "once no process of that job runs");
      }
    }
    self_ = encodeProcessIdentity(localProcessIdentity());
    appendRecord(kRegister, {}, toBytes(self_));
  }

  // "host 'vm', pid 12, registered 3.1 s ago, exited".
  static std::string describeRegistration(const ProcessIdentity& identity, Liveness liveness) {
    const int64_t nowMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    char age[32];
    std::snprintf(age, sizeof(age), "%.1f s", static_cast<double>(nowMs - identity.takenAtMs) / 1000.0);
    const char* state = liveness == Liveness::kGone      ? "exited"
                        : liveness == Liveness::kRunning ? "still running"
                                                         : "on another host or pid namespace";
    return describeProcess(identity) + ", registered " + age + " ago, " + state;
  }

  // Empties the file down to its header and forgets what was read of it.
  void startOver() {
    if (::ftruncate(fd_.get(), static_cast<off_t>(kHeaderSize)) != 0) {
      throw StoreError("FileStore '" + path_ + "': cannot start the file over: " + net::errnoText(errno));
    }
    map_.clear();
    live_.clear();
    finished_ = 0;
    offset_ = kHeaderSize;
  }

  [[noreturn]] void corrupt(const std::string& what) const {
    throw StoreError("FileStore '" + path_ + "': the file is corrupt: " + what);
  }

  uint64_t fileSize() const {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) {
      throw StoreError("FileStore '" + path_ + "': cannot stat: " + net::errnoText(errno));
    }
    return static_cast<uint64_t>(st.st_size);
  }

  // Whether path_ still names the file open as fd.
  bool isAtPath(int fd) const {
    struct stat opened {};
    struct stat named {};
    if (::fstat(fd, &opened) != 0) {
      throw StoreError("FileStore '" + path_ + "': cannot stat: " + net::errnoText(errno));
    }
    if (::stat(path_.c_str(), &named) != 0) {
      if (errno == ENOENT) {
        return false;
      }
      throw StoreError("FileStore '" + path_ + "': cannot stat: " + net::errnoText(errno));
    }
    return opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
  }

  void readExact(uint8_t* data, size_t size, uint64_t offset) const {
    while (size > 0) {
      const ssize_t n = ::pread(fd_.get(), data, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0) {
        throw StoreError("FileStore '" + path_ + "': cannot read: " + net::errnoText(errno));
      }
      if (n == 0) {
        corrupt("it ended at byte " + std::to_string(offset) + " while being read");
      }
      data += n;
      size -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }

  void writeAll(const uint8_t* data, size_t size, uint64_t offset) const {
    while (size > 0) {
      const ssize_t n = ::pwrite(fd_.get(), data, size, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n < 0) {
        throw StoreError("FileStore '" + path_ + "': cannot write: " + net::errnoText(errno));
      }
      data += n;
      size -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
  }

  // Reads and applies whatever was appended since the last call. Needs the file lock.
  void refresh() {
    const uint64_t size = fileSize();
    if (offset_ == 0) {
      if (size < kHeaderSize) {
        corrupt("it has " + std::to_string(size) + " bytes, fewer than its header");
      }
      uint8_t header[kHeaderSize];
      readExact(header, kHeaderSize, 0);
      if (std::memcmp(header, kMagic, kHeaderSize) != 0) {
        corrupt("it does not start with the FileStore header (is it a FileStore file?)");
      }
      offset_ = kHeaderSize;
    }
    if (size < offset_) {
      corrupt("it shrank to " + std::to_string(size) + " bytes after " + std::to_string(offset_) +
              " had been read");
    }
    if (size == offset_) {
      return;
    }
    Bytes tail(size - offset_);
    readExact(tail.data(), tail.size(), offset_);
    apply(tail.data(), tail.size());
  }

  // Applies the records in data, which starts at file offset offset_, advancing offset_
  // past each one applied. Lengths are checked against the bytes present before anything
  // is allocated for them.
  void apply(const uint8_t* data, size_t size) {
    size_t pos = 0;
    while (pos < size) {
      const auto where = [this] { return "record at byte " + std::to_string(offset_); };
      if (size - pos < kRecordHeaderSize) {
        corrupt(where() + " is truncated");
      }
      const uint8_t type = data[pos];
      const uint32_t keySize = loadLe32(data + pos + 1);
      const uint32_t valueSize = loadLe32(data + pos + 5);
      const uint64_t recordSize = kRecordHeaderSize + uint64_t{keySize} + valueSize;
      if (recordSize > size - pos) {
        corrupt(where() + " claims " + std::to_string(recordSize) + " bytes but only " +
                std::to_string(size - pos) + " remain");
      }
      const uint8_t* keyData = data + pos + kRecordHeaderSize;
      const uint8_t* valueData = keyData + keySize;
      std::string key(reinterpret_cast<const char*>(keyData), keySize);
      switch (type) {
        case kSet:
          map_[std::move(key)].assign(valueData, valueData + valueSize);
          break;
        case kAppend: {
          Bytes& stored = map_[std::move(key)];
          stored.insert(stored.end(), valueData, valueData + valueSize);
          break;
        }
        case kDelete:
          if (valueSize != 0) {
            corrupt(where() + " deletes a key but carries a value");
          }
          map_.erase(key);
          break;
        case kRegister:
          if (keySize != 0) corrupt(where() + " is an invalid registration");
          live_.emplace_back(reinterpret_cast<const char*>(valueData), valueSize);
          break;
        case kDeregister: {
          // Closes the registration with the same value (an older file's empty one: the first).
          const std::string registration(reinterpret_cast<const char*>(valueData), valueSize);
          auto open = std::find(live_.begin(), live_.end(), registration);
          if (open == live_.end() && registration.empty() && !live_.empty()) open = live_.begin();
          if (keySize != 0 || open == live_.end()) corrupt(where() + " is an invalid deregistration");
          live_.erase(open);
          ++finished_;
          break;
        }
        default:
          corrupt(where() + " has unknown type " + std::to_string(type));
      }
      pos += recordSize;
      offset_ += recordSize;
    }
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> absent;
    for (const auto& key : keys) {
      if (map_.count(key) == 0) {
        absent.push_back(key);
      }
    }
    return absent;
  }

  const std::string path_;
  std::mutex mutex_;
  Fd fd_;
  // Bytes of the file applied to map_ (0: not even the header yet).
  uint64_t offset_ = 0;
  // The registrations of FileStore objects not yet deregistered (each its process's
  // identity); how many were deregistered; this object's own registration.
  std::vector<std::string> live_;
  int64_t finished_ = 0;
  std::string self_;
};

FileStore::FileStore(const std::string& path, int worldSize, Timeout timeout)
    : Store(timeout), path_(path), worldSize_(worldSize) {
  if (path_.empty()) {
    throw InvalidArgument("FileStore: the path must not be empty");
  }
  impl_ = std::make_unique<Impl>(path_, worldSize_);
}

FileStore::~FileStore() {
  if (worldSize_ <= 0) {
    return;
  }
  try {
    impl_->locked(true, [&] { impl_->deregister(worldSize_); });
  } catch (const std::exception& e) {
    RINGTREE_WARN("FileStore '" << path_ << "': cannot deregister: " << e.what());
  }
}

std::shared_ptr<Store> FileStore::clone() {
  // Not registered: the objects the job created decide when the file goes.
  return std::make_shared<FileStore>(path_, -1, timeout());
}

void FileStore::set(const std::string& key, const Bytes& value) {
  impl_->locked(true, [&] { impl_->appendRecord(kSet, key, value); });
}

Bytes FileStore::get(const std::string& key) {
  return impl_->waitFor({key}, timeout(), "get", [&] { return impl_->map_.at(key); });
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  return impl_->locked(true, [&] {
    const int64_t result = detail::addToCounter("FileStore '" + path_ + "' add: ", key, impl_->find(key), delta);
    impl_->appendRecord(kSet, key, toBytes(std::to_string(result)));
    return result;
  });
}

Bytes FileStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return impl_->locked(true, [&] {
    return detail::compareSet(impl_->find(key), expected, desired,
                              [&](const Bytes& value) { impl_->appendRecord(kSet, key, value); });
  });
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return impl_->locked(false, [&] { return impl_->hasAll(keys); });
}

void FileStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  requireValidTimeout(timeout);
  impl_->waitFor(keys, timeout, "wait", [] {});
}

bool FileStore::deleteKey(const std::string& key) {
  return impl_->locked(true, [&] {
    if (impl_->map_.count(key) == 0) {
      return false;
    }
    impl_->appendRecord(kDelete, key, {});
    return true;
  });
}

int64_t FileStore::numKeys() {
  return impl_->locked(false, [&] { return static_cast<int64_t>(impl_->map_.size()); });
}

void FileStore::append(const std::string& key, const Bytes& value) {
  impl_->locked(true, [&] { impl_->appendRecord(kAppend, key, value); });
}

}  // namespace ringtree
