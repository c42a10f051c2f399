#pragma once

#include <string>

// Which kernel a process runs on: the first half of the "same host" decision (the second
// is the shared-memory probe, see transport/shm/device.h).
namespace ringtree::rendezvous {

struct HostIdentity {
  std::string hostname;
  // /proc/sys/kernel/random/boot_id: differs between hosts that share a name (containers
  // on several machines) and changes at every boot. Empty when unreadable.
  std::string bootId;
};

// This process's identity. Never throws: an unreadable part is left empty.
HostIdentity localHostIdentity();

// Whether a and b name the same running kernel (same host name and boot id).
bool sameHost(const HostIdentity& a, const HostIdentity& b);

}  // namespace ringtree::rendezvous
