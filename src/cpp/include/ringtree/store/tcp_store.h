#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ringtree/store/store.h>

namespace ringtree {

class TcpStoreServer;

struct TcpStoreOptions {
  // Port to listen on (server) or connect to (client). 0 with isServer: the kernel picks a
  // free port and port() reports it, so there is never a "find a free port" race.
  uint16_t port = 0;
  // Whether this object starts the server (in a background thread of this process) in
  // addition to being a client of it.
  bool isServer = false;
  // With isServer and waitForWorkers: the constructor returns only once numWorkers
  // clients (this one included) have connected, or throws StoreError at the timeout.
  // numWorkers <= 0 means unknown (do not wait).
  int numWorkers = -1;
  bool waitForWorkers = true;
  // Shared secret. Empty: taken from RINGTREE_STORE_TOKEN when that is set. A server with
  // a token refuses clients that do not present the same token; a client presenting a
  // token to a server without one is refused too.
  std::string token;
  // Limit on one request frame (key + values), enforced by the server before it allocates.
  uint32_t maxMessageBytes = 64u << 20;
  // Server side: the address to bind. Empty: all interfaces (IPv6 dual-stack when
  // available, else IPv4).
  std::string bindAddress;
};

// A store served over TCP: one process runs the server (an epoll loop on a background
// thread, any number of clients), every process (the server's included) talks to it
// through a client connection.
//
// Connecting retries with backoff until the timeout and then throws NetworkError naming
// host:port and the last error. A connection lost mid-request throws NetworkError.
// The server answers a malformed, truncated or oversized frame by closing that one
// connection; everyone else is served on.
//
// Threading: one client connection per object, guarded by a mutex; requests from several
// threads are serialised. A blocking get()/wait() occupies the connection while it waits.
class RINGTREE_API TcpStore : public Store {
 public:
  TcpStore(const std::string& host, const TcpStoreOptions& options = {},
           Timeout timeout = kDefaultTimeout);
  ~TcpStore() override;

  // The host this client connected to, and the port actually used (the bound one when
  // this object started the server on port 0).
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  bool isServer() const { return server_ != nullptr; }
  // Number of client connections the server currently holds (this one included);
  // -1 when this object does not run the server.
  int numServerClients() const;
  // Number of client connections the server has accepted since it started (closed ones
  // included); -1 when this object does not run the server.
  int64_t totalServerClients() const;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  void append(const std::string& key, const Bytes& value) override;
  std::shared_ptr<Store> clone() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;

 private:
  class Client;
  std::string host_;
  uint16_t port_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Client> client_;
};

}  // namespace ringtree
