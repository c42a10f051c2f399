#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include <ringtree/error.h>

namespace ringtree::transport::shm {

namespace {

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

[[noreturn]] void throwErrno(const std::string& what, int error) {
  throw NetworkError(what + ": " + net::errnoText(error));
}

// Maps fd shared and read-write, faulting in every page (MAP_POPULATE) with kYes.
uint8_t* mapShared(int fd, size_t bytes, Prefault prefault, const std::string& what) {
  const int flags = MAP_SHARED | (prefault == Prefault::kYes ? MAP_POPULATE : 0);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (data == MAP_FAILED) throwErrno("cannot map " + what, errno);
  return static_cast<uint8_t*>(data);
}

}  // namespace

Segment::~Segment() { unmap(); }

Segment::Segment(Segment&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Segment::unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Segment Segment::create(const char* name, size_t bytes, Prefault prefault) {
  const std::string what = "shared memory segment of " + std::to_string(bytes) + " bytes";
  net::Socket fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) throwErrno("cannot create " + what + " (memfd_create)", errno);
  if (::ftruncate(fd.fd(), static_cast<off_t>(bytes)) != 0) throwErrno("cannot size " + what, errno);
  if (::fcntl(fd.fd(), F_ADD_SEALS, kSeals) != 0) throwErrno("cannot seal " + what, errno);
  uint8_t* data = mapShared(fd.fd(), bytes, prefault, what);
  return Segment(std::move(fd), data, bytes);
}

Segment Segment::map(net::Socket fd, size_t bytes, Prefault prefault) {
  const std::string what = "the peer's shared memory segment";
  struct stat st {};
  if (::fstat(fd.fd(), &st) != 0) throwErrno("cannot inspect " + what, errno);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    throw NetworkError(what + " has " + std::to_string(st.st_size) + " bytes, expected " +
                       std::to_string(bytes));
  }
  const int seals = ::fcntl(fd.fd(), F_GET_SEALS);
  if (seals < 0) throwErrno(what + " is not a memfd", errno);
  if ((seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
    throw NetworkError(what + " is not sealed against shrinking");
  }
  uint8_t* data = mapShared(fd.fd(), bytes, prefault, what);
  return Segment(std::move(fd), data, bytes);
}

}  // namespace ringtree::transport::shm
