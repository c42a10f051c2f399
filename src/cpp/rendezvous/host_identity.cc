#include "rendezvous/host_identity.h"

#include "common/process_identity.h"

namespace ringtree::rendezvous {

HostIdentity localHostIdentity() {
  HostIdentity identity;
  identity.hostname = localHostname();
  identity.bootId = localBootId();
  return identity;
}

bool sameHost(const HostIdentity& a, const HostIdentity& b) {
  return a.hostname == b.hostname && a.bootId == b.bootId;
}

}  // namespace ringtree::rendezvous
