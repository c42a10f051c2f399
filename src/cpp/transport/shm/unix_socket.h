#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <string>

#include "common/socket.h"

// AF_UNIX helpers of the shared-memory transport's handshake (the Listener and connect()
// declared in device.h are built on them too).
namespace ringtree::transport::shm {

// "@name": how messages show an abstract-namespace socket name.
std::string abstractText(const std::string& name);

// Sends exactly `bytes` with descriptor `fd` attached to the first byte (SCM_RIGHTS),
// polling until deadline. Never raises SIGPIPE.
net::IoResult sendWithDescriptor(int socket, const void* data, size_t bytes, int fd, net::Deadline deadline);

// What recvWithDescriptor() collected besides the bytes.
struct Ancillary {
  // The single descriptor that arrived (close-on-exec); invalid if none did. Extra
  // descriptors are closed and counted in extraDescriptors.
  net::Socket descriptor;
  int extraDescriptors = 0;
  // SCM_CREDENTIALS of the sending process (needs SO_PASSCRED on the socket before the
  // peer sends); pid 0 when none arrived.
  ucred credentials{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
};

// Receives exactly `bytes`, polling until deadline, collecting descriptors and
// credentials into *ancillary.
net::IoResult recvWithDescriptor(int socket, void* data, size_t bytes, net::Deadline deadline,
                                 Ancillary* ancillary);

}  // namespace ringtree::transport::shm
