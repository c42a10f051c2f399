#pragma once

#include <cstddef>
#include <cstdint>

#include "common/socket.h"

namespace ringtree::transport::shm {

// A shared-memory segment: a memfd_create() file mapped read-write (MAP_SHARED) into
// this process. With Prefault::kYes every page is faulted in at creation, so that the
// data path never takes a page fault; with kNo a page takes memory only once it is first
// touched (a pair's ring: many pairs of a large job never carry a byte). The file has no
// name in any file system (it is not in /dev/shm) and is freed when the last descriptor
// and mapping are gone, including after kill -9.
//
// Created segments are sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW
// | F_SEAL_SEAL), and map() refuses descriptors without those seals: a peer holding the
// descriptor cannot truncate the file under our mapping (which would turn our accesses
// into SIGBUS). Move-only; not thread-safe.
enum class Prefault { kYes, kNo };

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // A new zero-filled segment of `bytes` (a multiple of the page size), named `name` in
  // /proc/<pid>/maps. Throws NetworkError with the errno text when the kernel refuses.
  static Segment create(const char* name, size_t bytes, Prefault prefault = Prefault::kYes);
  // Maps a segment received from another process, taking ownership of fd. Throws
  // NetworkError unless fd is a sealed memfd of exactly `bytes` bytes.
  static Segment map(net::Socket fd, size_t bytes, Prefault prefault = Prefault::kYes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The memfd; invalid after closeDescriptor() (the mapping stays).
  int descriptor() const { return fd_.fd(); }
  void closeDescriptor() { fd_.reset(); }

 private:
  Segment(net::Socket fd, uint8_t* data, size_t size) : fd_(std::move(fd)), data_(data), size_(size) {}
  void unmap();

  net::Socket fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ringtree::transport::shm
