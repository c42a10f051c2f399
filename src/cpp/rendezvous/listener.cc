#include "rendezvous/listener.h"

#include <ringtree/error.h>

#include "common/logging.h"
#include "common/process_identity.h"

namespace ringtree::rendezvous {

TcpListener listenForPeers(const std::string& interface) {
  TcpListener listener;
  if (!interface.empty()) {
    std::string error;
    const auto addresses = net::interfaceAddresses(interface, &error);
    if (addresses.empty()) throw NetworkError("cannot listen for peers: " + error);
    std::string lastError;
    for (const auto& address : addresses) {
      try {
        listener.socket = net::listenTcp(address, 0);
        listener.host = address;
        listener.origin = "interface '" + interface + "'";
        break;
      } catch (const NetworkError& e) {
        lastError = e.what();
      }
    }
    if (!listener.socket.valid()) {
      throw NetworkError("cannot listen for peers on interface '" + interface + "': " + lastError);
    }
  } else {
    const std::string hostname = localHostname();
    std::string error;
    for (const auto& address : net::resolve(hostname, 0, &error)) {
      if (net::isLoopback(address)) continue;
      try {
        listener.socket = net::listenTcp(net::numericHost(address), 0);
        listener.host = net::numericHost(address);
        listener.origin = "host name '" + hostname + "'";
        break;
      } catch (const NetworkError& e) {
        RINGTREE_DEBUG("cannot listen on " << address.toString() << " (host name '" << hostname
                                           << "'): " << e.what());
      }
    }
    if (!listener.socket.valid()) {
      // The host name is unknown, loopback only (Debian's 127.0.1.1), or not ours.
      listener.socket = net::listenTcp("", 0);
      listener.host = net::firstExternalAddress();
      if (listener.host.empty()) listener.host = "127.0.0.1";
      listener.origin = "all interfaces (host name '" + hostname + "' does not resolve to a usable address)";
    }
  }
  listener.port = net::localPort(listener.socket.fd());
  return listener;
}

}  // namespace ringtree::rendezvous
