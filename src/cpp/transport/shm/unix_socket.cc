#include "transport/shm/unix_socket.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include <ringtree/error.h>

#include "transport/shm/device.h"

namespace ringtree::transport::shm {

namespace {

// Longest abstract name: sun_path minus the leading NUL.
constexpr size_t kMaxNameBytes = sizeof(sockaddr_un::sun_path) - 1;
// Attempts at binding a fresh random name before giving up (a clash is astronomically
// unlikely; a failure repeats for another reason).
constexpr int kBindAttempts = 4;

// Waits until socket is ready for events or the deadline passes: true when ready
// (including error and hang-up conditions, which the next call reports), false on timeout.
bool waitReady(int socket, short events, net::Deadline deadline, int* error) {
  for (;;) {
    pollfd pfd{socket, events, 0};
    const int rc = ::poll(&pfd, 1, net::pollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (net::Clock::now() >= deadline) return false;
      continue;  // poll() rounds to whole milliseconds
    }
    if (errno != EINTR) {
      *error = errno;
      return false;
    }
  }
}

// The IoResult of a failed waitReady().
net::IoResult waitFailure(int error) {
  net::IoResult result;
  result.status = error == 0 ? net::IoStatus::kTimeout : net::IoStatus::kError;
  result.error = error;
  return result;
}

net::IoResult ioFailure(int error) {
  net::IoResult result;
  const bool closed = error == 0 || error == EPIPE || error == ECONNRESET || error == ENOTCONN;
  result.status = closed ? net::IoStatus::kClosed : net::IoStatus::kError;
  result.error = error;
  return result;
}

socklen_t abstractAddress(const std::string& name, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  std::memcpy(address->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string randomName() {
  unsigned char random[16];
  size_t filled = 0;
  while (filled < sizeof(random)) {
    const ssize_t rc = ::getrandom(random + filled, sizeof(random) - filled, 0);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw NetworkError("cannot name a shared-memory listener: getrandom: " + net::errnoText(errno));
    }
    filled += static_cast<size_t>(rc);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string name = "ringtree-shm-";
  for (unsigned char byte : random) {
    name += kHex[byte >> 4];
    name += kHex[byte & 15];
  }
  return name;
}

}  // namespace

std::string abstractText(const std::string& name) { return "@" + name; }

net::IoResult sendWithDescriptor(int socket, const void* data, size_t bytes, int fd, net::Deadline deadline) {
  const auto* cursor = static_cast<const uint8_t*>(data);
  size_t left = bytes;
  bool descriptorSent = false;
  while (left > 0) {
    iovec iov{const_cast<uint8_t*>(cursor), left};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!descriptorSent) {
      std::memset(control, 0, sizeof(control));
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
    }
    const ssize_t rc = ::sendmsg(socket, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (rc > 0) {
      descriptorSent = true;
      cursor += rc;
      left -= static_cast<size_t>(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int error = 0;
      if (!waitReady(socket, POLLOUT, deadline, &error)) return waitFailure(error);
      continue;
    }
    return ioFailure(rc < 0 ? errno : 0);
  }
  return {};
}

net::IoResult recvWithDescriptor(int socket, void* data, size_t bytes, net::Deadline deadline,
                                 Ancillary* ancillary) {
  auto* cursor = static_cast<uint8_t*>(data);
  size_t left = bytes;
  while (left > 0) {
    iovec iov{cursor, left};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(ucred))];
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t rc = ::recvmsg(socket, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int error = 0;
      if (!waitReady(socket, POLLIN, deadline, &error)) return waitFailure(error);
      continue;
    }
    if (rc <= 0) return ioFailure(rc < 0 ? errno : 0);
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level != SOL_SOCKET) continue;
      const size_t payload = header->cmsg_len - CMSG_LEN(0);
      if (header->cmsg_type == SCM_RIGHTS) {
        for (size_t i = 0; i + sizeof(int) <= payload; i += sizeof(int)) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(header) + i, sizeof(int));
          if (!ancillary->descriptor.valid()) {
            ancillary->descriptor.reset(fd);
          } else {
            ::close(fd);
            ++ancillary->extraDescriptors;
          }
        }
      } else if (header->cmsg_type == SCM_CREDENTIALS && payload >= sizeof(ucred) &&
                 ancillary->credentials.pid == 0) {
        std::memcpy(&ancillary->credentials, CMSG_DATA(header), sizeof(ucred));
      }
    }
    cursor += rc;
    left -= static_cast<size_t>(rc);
  }
  return {};
}

Listener::Listener() {
  int lastError = 0;
  for (int attempt = 0; attempt < kBindAttempts; ++attempt) {
    net::Socket socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket.valid()) {
      throw NetworkError("cannot create a shared-memory listener socket: " + net::errnoText(errno));
    }
    const std::string name = randomName();
    sockaddr_un address;
    const socklen_t length = abstractAddress(name, &address);
    if (::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), length) == 0 &&
        ::listen(socket.fd(), SOMAXCONN) == 0) {
      name_ = name;
      socket_ = std::move(socket);
      return;
    }
    lastError = errno;
    if (lastError != EADDRINUSE) break;
  }
  throw NetworkError("cannot listen on an abstract unix socket: " + net::errnoText(lastError));
}

Listener::~Listener() = default;

net::Socket Listener::accept(net::Deadline deadline) {
  for (;;) {
    net::Socket socket(::accept4(socket_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (socket.valid()) return socket;
    const int error = errno;
    if (error == EINTR || error == ECONNABORTED) continue;
    if (error != EAGAIN && error != EWOULDBLOCK) {
      throw NetworkError("cannot accept a shared-memory connection on " + abstractText(name_) + ": " +
                         net::errnoText(error));
    }
    int waitError = 0;
    if (!waitReady(socket_.fd(), POLLIN, deadline, &waitError)) {
      if (waitError != 0) {
        throw NetworkError("cannot accept a shared-memory connection on " + abstractText(name_) + ": " +
                           net::errnoText(waitError));
      }
      throw TimeoutError("timed out waiting for a shared-memory connection on " + abstractText(name_));
    }
  }
}

net::Socket connect(const std::string& name, net::Deadline deadline, std::string* error) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    *error = "invalid shared-memory listener name '" + name + "'";
    return {};
  }
  sockaddr_un address;
  const socklen_t length = abstractAddress(name, &address);
  for (;;) {
    net::Socket socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!socket.valid()) {
      *error = "cannot create a unix socket: " + net::errnoText(errno);
      return {};
    }
    if (::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), length) == 0) return socket;
    const int failure = errno;
    // EAGAIN: the listener's backlog is full; it is there, so wait for room.
    if (failure != EAGAIN && failure != EINTR) {
      *error = "cannot connect to shared-memory listener " + abstractText(name) + ": " + net::errnoText(failure);
      return {};
    }
    if (net::Clock::now() >= deadline) {
      *error = "timed out connecting to shared-memory listener " + abstractText(name) + " (backlog full)";
      return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace ringtree::transport::shm
