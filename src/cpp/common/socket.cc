#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <set>

#include <ringtree/before_waiting.h>
#include <ringtree/error.h>

#include "common/process_identity.h"

namespace ringtree::net {

namespace {

// Waits until fd is ready for events or the deadline passes. Returns 1 when ready
// (including error/hang-up conditions, which the next I/O call reports), 0 on timeout,
// or -errno.
int waitFor(int fd, short events, Deadline deadline) {
  BeforeWaiting::notify();
  for (;;) {
    pollfd pfd{fd, events, 0};
    const int rc = ::poll(&pfd, 1, pollTimeoutMs(deadline));
    if (rc > 0) return 1;
    if (rc == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;  // poll rounds to whole milliseconds; wait out the remainder
    }
    if (errno != EINTR) return -errno;
  }
}

bool isClosedError(int error) { return error == EPIPE || error == ECONNRESET || error == ENOTCONN; }

std::string hostText(const sockaddr* sa, char* buf, socklen_t size) {
  const void* raw = sa->sa_family == AF_INET6
                        ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr)
                        : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
  if (::inet_ntop(sa->sa_family, raw, buf, size) == nullptr) return "?";
  return buf;
}

std::string sockaddrText(const sockaddr_storage& storage) {
  const auto* sa = reinterpret_cast<const sockaddr*>(&storage);
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    return formatHostPort(hostText(sa, buf, sizeof(buf)), ntohs(in6->sin6_port));
  }
  if (sa->sa_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(sa);
    return formatHostPort(hostText(sa, buf, sizeof(buf)), ntohs(in4->sin_port));
  }
  return "unknown address family " + std::to_string(sa->sa_family);
}

// Binds and listens on one address; returns 0 and the socket, or the errno value.
int bindAndListen(int family, const sockaddr* sa, socklen_t length, bool dualStack, int backlog,
                  Socket* out) {
  Socket socket(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return errno;
  const int one = 1;
  if (::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) return errno;
  if (family == AF_INET6) {
    const int v6only = dualStack ? 0 : 1;
    if (::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only)) != 0) {
      return errno;
    }
  }
  if (::bind(socket.fd(), sa, length) != 0) return errno;
  if (::listen(socket.fd(), backlog) != 0) return errno;
  *out = std::move(socket);
  return 0;
}

}  // namespace

Deadline deadlineAfter(std::chrono::milliseconds timeout) {
  const Deadline now = Clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(kNoDeadline - now);
  if (timeout >= room) return kNoDeadline;
  return now + timeout;
}

int pollTimeoutMs(Deadline deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto remaining = deadline - Clock::now();
  if (remaining <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(remaining).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

std::string errnoText(int error) {
  char buf[256] = {0};
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = ::strerror_r(error, buf, sizeof(buf));
  return text != nullptr ? std::string(text) : "errno " + std::to_string(error);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string Address::toString() const { return sockaddrText(storage); }

std::string formatHostPort(const std::string& host, uint16_t port) {
  const bool ipv6Literal = host.find(':') != std::string::npos && host.front() != '[';
  return (ipv6Literal ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::vector<Address> resolve(const std::string& host, uint16_t port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
  // A bracketed IPv6 literal ("[::1]") is accepted as well.
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc == EAI_NONAME || rc == EAI_ADDRFAMILY) {
    // AI_ADDRCONFIG hides loopback-only families (e.g. "::1" on a host whose only IPv6
    // address is loopback); ask again without it.
    hints.ai_flags = AI_NUMERICSERV;
    rc = ::getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &list);
  }
  std::vector<Address> addresses;
  if (rc != 0) {
    *error = rc == EAI_SYSTEM ? errnoText(errno) : std::string(::gai_strerror(rc));
    return addresses;
  }
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Address address;
    std::memcpy(&address.storage, ai->ai_addr, ai->ai_addrlen);
    address.length = ai->ai_addrlen;
    addresses.push_back(address);
  }
  ::freeaddrinfo(list);
  if (addresses.empty()) *error = "no usable address";
  return addresses;
}

int connectTo(const Address& address, Deadline deadline, Socket* out) {
  const auto* sa = reinterpret_cast<const sockaddr*>(&address.storage);
  Socket socket(::socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket.valid()) return errno;
  if (::connect(socket.fd(), sa, address.length) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) return errno;
    const int ready = waitFor(socket.fd(), POLLOUT, deadline);
    if (ready == 0) return ETIMEDOUT;
    if (ready < 0) return -ready;
    int error = 0;
    socklen_t length = sizeof(error);
    if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
    if (error != 0) return error;
  }
  *out = std::move(socket);
  return 0;
}

Socket listenTcp(const std::string& bindAddress, uint16_t port, int backlog) {
  Socket socket;
  int error = 0;
  if (bindAddress.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(port);
    error = bindAndListen(AF_INET6, reinterpret_cast<const sockaddr*>(&any6), sizeof(any6),
                          /*dualStack=*/true, backlog, &socket);
    // Fall back to IPv4 only where IPv6 itself is unavailable; any other error (e.g. the
    // port is taken) is reported as is.
    if (error == EAFNOSUPPORT || error == EPROTONOSUPPORT || error == EADDRNOTAVAIL) {
      sockaddr_in any4{};
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(port);
      error = bindAndListen(AF_INET, reinterpret_cast<const sockaddr*>(&any4), sizeof(any4),
                            /*dualStack=*/false, backlog, &socket);
    }
  } else {
    std::string resolveError;
    const auto addresses = resolve(bindAddress, port, &resolveError);
    if (addresses.empty()) {
      throw NetworkError("cannot listen on " + formatHostPort(bindAddress, port) + ": " + resolveError);
    }
    for (const auto& address : addresses) {
      const auto* sa = reinterpret_cast<const sockaddr*>(&address.storage);
      error = bindAndListen(sa->sa_family, sa, address.length, /*dualStack=*/false, backlog, &socket);
      if (error == 0) break;
    }
  }
  if (error != 0) {
    std::string holders;
    if (error == EADDRINUSE && port != 0) {
      for (const int64_t pid : processesListeningOn(port)) {
        holders += (holders.empty() ? "" : ", ") +
                   (pid == ::getpid() ? "this process (pid " + std::to_string(pid) + ")" : describeLocalProcess(pid));
      }
      holders = holders.empty() ? "" : " (port " + std::to_string(port) + " is held by " + holders + " on this host)";
    }
    throw NetworkError("cannot listen on " +
                       formatHostPort(bindAddress.empty() ? "*" : bindAddress, port) + ": " +
                       errnoText(error) + holders);
  }
  return socket;
}

uint16_t localPort(int fd) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    throw NetworkError("getsockname failed: " + errnoText(errno));
  }
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  throw NetworkError("getsockname returned address family " + std::to_string(storage.ss_family));
}

bool hungUp(int fd) noexcept {
  pollfd pfd{fd, POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

std::string peerName(int fd) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) return "unknown peer";
  return sockaddrText(storage);
}

std::string numericHost(const Address& address) {
  char buf[INET6_ADDRSTRLEN] = {0};
  return hostText(reinterpret_cast<const sockaddr*>(&address.storage), buf, sizeof(buf));
}

bool isLoopback(const Address& address) {
  const auto* sa = reinterpret_cast<const sockaddr*>(&address.storage);
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
  }
  return false;
}

namespace {

// The usable addresses of the interfaces getifaddrs() reports, in its order, with the
// interface name and flags; link-local IPv6 addresses left out.
struct InterfaceAddress {
  std::string interface;
  unsigned flags;
  int family;
  std::string host;
};

std::vector<InterfaceAddress> listInterfaceAddresses(std::set<std::string>* names) {
  std::vector<InterfaceAddress> result;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return result;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (names != nullptr) names->insert(ifa->ifa_name);
    const sockaddr* sa = ifa->ifa_addr;
    if (sa == nullptr || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)) continue;
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr)) {
      continue;
    }
    char buf[INET6_ADDRSTRLEN] = {0};
    result.push_back({ifa->ifa_name, ifa->ifa_flags, sa->sa_family, hostText(sa, buf, sizeof(buf))});
  }
  ::freeifaddrs(list);
  return result;
}

}  // namespace

std::vector<std::string> interfaceAddresses(const std::string& name, std::string* error) {
  std::set<std::string> names;
  const auto all = listInterfaceAddresses(&names);
  std::vector<std::string> result;
  for (const int family : {AF_INET, AF_INET6}) {
    for (const auto& entry : all) {
      if (entry.interface == name && entry.family == family) result.push_back(entry.host);
    }
  }
  if (result.empty()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    *error = (names.count(name) != 0 ? "interface '" + name + "' has no usable IPv4 or IPv6 address"
                                     : "no interface named '" + name + "'") +
             " (interfaces: " + (known.empty() ? "none" : known) + ")";
  }
  return result;
}

std::string firstExternalAddress() {
  const auto all = listInterfaceAddresses(nullptr);
  for (const int family : {AF_INET, AF_INET6}) {
    for (const auto& entry : all) {
      if (entry.family == family && (entry.flags & IFF_UP) != 0 && (entry.flags & IFF_LOOPBACK) == 0) {
        return entry.host;
      }
    }
  }
  return {};
}

void setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw NetworkError("cannot make socket non-blocking: " + errnoText(errno));
  }
}

void setNoDelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    throw NetworkError("cannot set TCP_NODELAY: " + errnoText(errno));
  }
}

std::string IoResult::describe() const {
  switch (status) {
    case IoStatus::kOk: return "ok";
    case IoStatus::kTimeout: return "timed out";
    case IoStatus::kClosed:
      return error == 0 ? "connection closed by peer" : "connection closed by peer (" + errnoText(error) + ")";
    case IoStatus::kError: return errnoText(error);
  }
  return "unknown";
}

IoResult sendAll(int fd, const void* data, size_t size, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      const int error = errno;
      return {isClosedError(error) ? IoStatus::kClosed : IoStatus::kError, error};
    }
    const int ready = waitFor(fd, POLLOUT, deadline);
    if (ready == 0) return {IoStatus::kTimeout, 0};
    if (ready < 0) return {IoStatus::kError, -ready};
  }
  return {};
}

IoResult recvAll(int fd, void* data, size_t size, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {IoStatus::kClosed, 0};
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      const int error = errno;
      return {isClosedError(error) ? IoStatus::kClosed : IoStatus::kError, error};
    }
    const int ready = waitFor(fd, POLLIN, deadline);
    if (ready == 0) return {IoStatus::kTimeout, 0};
    if (ready < 0) return {IoStatus::kError, -ready};
  }
  return {};
}

}  // namespace ringtree::net
