#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

// Small POSIX TCP helpers shared by the store and the TCP transport: an owning fd,
// name resolution, connect/listen, and whole-buffer send/recv bounded by a deadline.
//
// Conventions: functions that report an errno value return it (0 = success) so that
// callers can retry and keep the last error; functions documented as throwing throw
// NetworkError with the address and the errno text. Nothing here raises SIGPIPE.
namespace ringtree::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A deadline that never passes.
constexpr Deadline kNoDeadline = Deadline::max();

// now + timeout, saturating at kNoDeadline instead of overflowing. timeout must be >= 0.
Deadline deadlineAfter(std::chrono::milliseconds timeout);

// Milliseconds until deadline in the form poll()/epoll_wait() take: rounded up, 0 once
// the deadline has passed, -1 for kNoDeadline, capped at INT_MAX.
int pollTimeoutMs(Deadline deadline);

// strerror_r text of an errno value; the one errno describer of the library (the
// stores use it too).
std::string errnoText(int error);

// Owns a file descriptor and closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release();
  // Closes the current fd (if any) and takes ownership of fd.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A resolved socket address.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;

  // "1.2.3.4:5" or "[::1]:5".
  std::string toString() const;
};

// "host:port", with brackets around an IPv6 literal: how every error names an endpoint.
std::string formatHostPort(const std::string& host, uint16_t port);

// Resolves host (a name, an IPv4 or an IPv6 literal) for a TCP connection to port, in
// getaddrinfo's preference order. On failure returns no address and sets *error to the
// resolver's message. Blocks for the duration of the lookup.
std::vector<Address> resolve(const std::string& host, uint16_t port, std::string* error);

// Connects a new non-blocking, close-on-exec socket to address, waiting at most until
// deadline. Returns 0 and stores the socket in *out, or returns the errno value of the
// failure (ETIMEDOUT when the deadline passed first).
int connectTo(const Address& address, Deadline deadline, Socket* out);

// Creates a non-blocking listening socket bound to bindAddress:port. An empty bindAddress
// means all interfaces (IPv6 dual-stack when the host supports IPv6, IPv4 otherwise);
// port 0 lets the kernel pick a free port (read it back with localPort()). Sets
// SO_REUSEADDR. Throws NetworkError naming the address when no address can be bound.
Socket listenTcp(const std::string& bindAddress, uint16_t port, int backlog = SOMAXCONN);

// The local port fd is bound to. Throws NetworkError.
uint16_t localPort(int fd);

// The peer address of a connected fd as text; "unknown peer" when it cannot be read.
std::string peerName(int fd);

// Whether a connected socket reports a hang-up (the peer closed it or died, or an
// error): a poll() that does not wait. Never throws.
bool hungUp(int fd) noexcept;

// The address without its port as numeric text: "1.2.3.4" or "::1".
std::string numericHost(const Address& address);

// Whether address is a loopback address (127.0.0.0/8, ::1, or ::ffff:127.x.x.x).
bool isLoopback(const Address& address);

// The addresses of the network interface called name, as numeric text: IPv4 first, then
// IPv6 (link-local IPv6 addresses, which need a scope to be reached, are left out).
// Returns none, and sets *error, when there is no such interface or it has no usable
// address; the error lists the interfaces that exist.
std::vector<std::string> interfaceAddresses(const std::string& name, std::string* error);

// The first address of an interface that is up and not loopback, IPv4 preferred over
// (non-link-local) IPv6; empty when there is none.
std::string firstExternalAddress();

// Sets O_NONBLOCK / TCP_NODELAY. Throw NetworkError.
void setNonBlocking(int fd);
void setNoDelay(int fd);

enum class IoStatus {
  kOk,       // every byte was transferred
  kTimeout,  // the deadline passed first
  kClosed,   // the peer closed the connection (EOF on receive, EPIPE/ECONNRESET)
  kError,    // another error; see IoResult::error
};

struct IoResult {
  IoStatus status = IoStatus::kOk;
  int error = 0;  // errno value for kClosed (0 on a clean EOF) and kError

  bool ok() const { return status == IoStatus::kOk; }
  // Human-readable reason, e.g. "timed out", "connection closed by peer", errno text.
  std::string describe() const;
};

// Send / receive exactly size bytes, polling until the deadline. Work on blocking and
// non-blocking sockets alike (each call uses MSG_DONTWAIT); retry on EINTR. After a
// failure an unknown number of bytes has been transferred, so the stream is unusable.
IoResult sendAll(int fd, const void* data, size_t size, Deadline deadline);
IoResult recvAll(int fd, void* data, size_t size, Deadline deadline);

}  // namespace ringtree::net
