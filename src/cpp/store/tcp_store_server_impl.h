#pragma once

// The TCPStore server's internals, shared by the files that implement it:
//   tcp_store_server.cc           the loop: accepting, reading, deadlines, waiters, replies, closing
//   tcp_store_server_ringtree.cc  requests of ringtree's protocol (store/tcp_store_protocol.h)
//   tcp_store_server_torch.cc     requests of torch's TCPStore client (store/torch_store_protocol.h)
// A connection's first byte decides its protocol: ringtree's frames start with "RTS1", torch's
// client starts with its VALIDATE query (0). Both work on one KeyTable.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "store/key_table.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server.h"
#include "store/torch_store_protocol.h"

namespace ringtree {

class TcpStoreServer::Impl {
 public:
  explicit Impl(const TcpStoreOptions& options);
  ~Impl() { stop(); }

  uint16_t port() const { return port_; }
  int numClients() const { return numClients_.load(); }
  int64_t totalClients() const;
  bool waitForClients(int count, net::Deadline deadline) const;
  void stop();

 private:
  enum class Protocol { kUnknown, kRingtree, kTorch };

  // A connection that has not completed the handshake by then is closed, so that silent
  // peers cannot pile up.
  static constexpr auto kHelloTimeout = std::chrono::seconds(30);
  // Bytes read from one connection per readiness event, so that one large upload does not
  // starve the others.
  static constexpr size_t kReadBudget = size_t{1} << 20;

  // A get/wait that could not be answered at once.
  struct Waiter {
    tcp_store_protocol::Op op = tcp_store_protocol::Op::kWait;  // ringtree's kGet or kWait; kWait for torch's
    std::vector<std::string> keys;
    std::string parkedOn;  // the missing key whose write re-checks this waiter
  };

  struct Connection {
    uint64_t id = 0;
    net::Socket socket;
    std::string peer;
    Protocol protocol = Protocol::kUnknown;
    bool authenticated = false;    // ringtree: HELLO accepted; torch: VALIDATE accepted
    bool closing = false;          // scheduled for closing; ignore its events
    bool closeAfterFlush = false;  // handshake refused: close once the reply is sent
    bool writeArmed = false;       // EPOLLOUT registered
    // ringtree: the frame being read, header first, then exactly header.length payload bytes.
    uint8_t headerBytes[tcp_store_protocol::kHeaderSize] = {};
    size_t headerFilled = 0;
    bool haveHeader = false;
    tcp_store_protocol::Header header;
    Bytes payload;
    size_t payloadFilled = 0;
    // torch: bytes received and not parsed yet (commands are not framed).
    Bytes in;
    // The replies being written.
    Bytes out;
    size_t outSent = 0;
    std::optional<Waiter> waiter;
    net::Deadline deadline = net::kNoDeadline;  // registered in deadlines_ unless kNoDeadline
  };

  void control(int operation, int fd, uint32_t events, uint64_t id);

  // ---- the loop (everything below runs on the loop thread only) ----
  void run();
  net::Deadline nextDeadline() const;
  Connection* find(uint64_t id);
  void acceptAll();
  void handleEvent(uint64_t id, uint32_t events);
  void onReadable(Connection& c);
  bool chooseProtocol(Connection& c);
  // A handshake accepted: c counts as a client from now on.
  void admit(Connection& c);

  // ---- ringtree's protocol (tcp_store_server_ringtree.cc) ----
  void readFrames(Connection& c);
  bool acceptHeader(Connection& c);
  void handleFrame(Connection& c, uint8_t code, const Bytes& payload);
  void handleHello(Connection& c, tcp_store_protocol::Reader& r);
  void startWait(Connection& c, tcp_store_protocol::Op op, std::vector<std::string> keys, int64_t timeoutMs);
  void answerWait(Connection& c, tcp_store_protocol::Op op, const std::vector<std::string>& keys);
  void replyTimeout(Connection& c, const std::vector<std::string>& keys);
  void replyMessage(Connection& c, tcp_store_protocol::Status status, const std::string& message);
  void reply(Connection& c, tcp_store_protocol::Status status, tcp_store_protocol::Writer&& w);

  // ---- torch's protocol (tcp_store_server_torch.cc) ----
  void readTorchCommands(Connection& c);
  void handleTorchCommand(Connection& c, torch_store_protocol::Command& command);
  void startTorchWait(Connection& c, std::vector<std::string> keys);

  // ---- waiters ----
  // Parks c's request until keys all exist (deadline: kNoDeadline for none).
  void park(Connection& c, Waiter waiter, net::Deadline deadline);
  // Re-checks the waiters parked on key after a write to it.
  void wake(const std::string& key);
  // Answers a waiter whose keys all exist, as its protocol does.
  void answerWaiter(Connection& c, const Waiter& waiter);
  // Removes c's waiter (if any) from the parked lists.
  void unpark(Connection& c);

  // ---- deadlines ----
  void setDeadline(Connection& c, net::Deadline deadline);
  void clearDeadline(Connection& c);
  void expireDeadlines(net::Deadline now);

  // ---- sending and closing ----
  // Queues bytes after any reply still being sent and sends as much as the socket takes.
  void send(Connection& c, Bytes bytes);
  void flush(Connection& c);
  bool setEvents(Connection& c, uint32_t events);
  void scheduleClose(Connection& c, const std::string& reason);
  void closePending();

  const std::string token_;
  const uint32_t maxMessageBytes_;
  net::Socket listener_;
  uint16_t port_ = 0;
  net::Socket epoll_;
  net::Socket wake_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::mutex stopMutex_;

  std::atomic<int> numClients_{0};
  mutable std::mutex clientsMutex_;
  mutable std::condition_variable clientsChanged_;
  int64_t totalClients_ = 0;  // guarded by clientsMutex_
  bool stopped_ = false;      // guarded by clientsMutex_

  // Loop-thread state.
  KeyTable table_;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t nextId_;
  std::set<std::pair<net::Deadline, uint64_t>> deadlines_;
  std::vector<uint64_t> pendingClose_;
  bool acceptPaused_ = false;
  net::Deadline acceptResumeAt_ = net::kNoDeadline;
};

}  // namespace ringtree
