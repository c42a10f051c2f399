#include "rendezvous/host_identity.h"

#include <unistd.h>

#include <climits>
#include <fstream>

namespace ringtree::rendezvous {

HostIdentity localHostIdentity() {
  HostIdentity identity;
  char name[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0) identity.hostname = name;
  std::ifstream bootId("/proc/sys/kernel/random/boot_id");
  std::getline(bootId, identity.bootId);
  return identity;
}

bool sameHost(const HostIdentity& a, const HostIdentity& b) {
  return a.hostname == b.hostname && a.bootId == b.bootId;
}

}  // namespace ringtree::rendezvous
