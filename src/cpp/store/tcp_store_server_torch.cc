// The TCPStore server's handling of torch's TCPStore client (store/torch_store_protocol.h),
// so that torch programs can use a store ringtree hosts. torch's client has no shared
// secret: a server with a token refuses it (tcp_store_server.cc, chooseProtocol).

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include <ringtree/error.h>

#include "common/logging.h"
#include "store/tcp_store_server_impl.h"

namespace ringtree {

namespace torch = torch_store_protocol;

namespace {

// Bytes a command may take beyond its longest field: its query byte, lengths and counts.
constexpr size_t kCommandOverhead = size_t{64} << 10;
// Bytes asked of the socket per read.
constexpr size_t kReadChunk = size_t{64} << 10;
// Largest MULTI_GET reply: what a reply of ringtree's protocol can carry.
constexpr uint64_t kMaxMultiGetReplyBytes = uint64_t{4} << 30;

}  // namespace

void TcpStoreServer::Impl::readTorchCommands(Connection& c) {
  const torch::Limits limits{maxMessageBytes_, tcp_store_protocol::kMaxKeysPerRequest};
  // One command is buffered at most (bounded by the request size limit) before it is parsed.
  const size_t bufferLimit = size_t{maxMessageBytes_} + kCommandOverhead;
  size_t budget = kReadBudget;
  while (!c.closing && budget > 0) {
    const size_t held = c.in.size();
    const size_t wanted = std::min({kReadChunk, budget, bufferLimit - held});
    if (wanted == 0) {
      scheduleClose(c, "a command longer than the limit of " + std::to_string(bufferLimit) + " bytes");
      return;
    }
    c.in.resize(held + wanted);
    const ssize_t n = ::recv(c.socket.fd(), c.in.data() + held, wanted, MSG_DONTWAIT);
    const int error = errno;
    c.in.resize(held + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0) {
      scheduleClose(c, held > 0 ? "closed by the peer in the middle of a command" : "closed by the peer");
      return;
    }
    if (n < 0) {
      if (error == EINTR) continue;
      if (error != EAGAIN && error != EWOULDBLOCK) scheduleClose(c, net::errnoText(error));
      return;
    }
    budget -= static_cast<size_t>(n);
    size_t parsed = 0;
    while (!c.closing) {
      torch::Command command;
      size_t consumed = 0;
      std::string problem;
      const torch::ParseResult result =
          torch::parseCommand(c.in.data() + parsed, c.in.size() - parsed, limits, &command, &consumed, &problem);
      if (result == torch::ParseResult::kIncomplete) break;
      if (result == torch::ParseResult::kMalformed) {
        scheduleClose(c, "malformed torch TCPStore command: " + problem);
        return;
      }
      parsed += consumed;
      handleTorchCommand(c, command);
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(parsed));
  }
}

void TcpStoreServer::Impl::handleTorchCommand(Connection& c, torch::Command& command) {
  const char* name = torch::queryName(static_cast<uint8_t>(command.query));
  if (!c.authenticated && command.query != torch::Query::kValidate) {
    scheduleClose(c, std::string(name) + " before VALIDATE");
    return;
  }
  if (c.waiter && command.query != torch::Query::kCancelWait) {
    scheduleClose(c, std::string(name) + " sent while its WAIT is unanswered");
    return;
  }
  // torch's client reads each reply before its next request, so a request that has a
  // reply never arrives while one is still being sent. Refusing it keeps a client that
  // does not read from piling up replies in the server's memory.
  const bool hasReply = command.query != torch::Query::kSet && command.query != torch::Query::kAppend &&
                        command.query != torch::Query::kMultiSet && command.query != torch::Query::kValidate &&
                        command.query != torch::Query::kCancelWait;
  if (hasReply && !c.out.empty()) {
    scheduleClose(c, std::string(name) + " sent before reading the reply to its previous request");
    return;
  }
  Bytes out;
  switch (command.query) {
    case torch::Query::kValidate:
      if (c.authenticated) return scheduleClose(c, "second VALIDATE");
      if (command.number != torch::kValidationMagic) return scheduleClose(c, "VALIDATE with a wrong magic number");
      admit(c);
      return;
    case torch::Query::kPing:
      torch::appendU32(out, static_cast<uint32_t>(command.number));
      break;
    case torch::Query::kSet:
      table_.set(command.keys[0], std::move(command.values[0]));
      wake(command.keys[0]);
      return;
    case torch::Query::kCompareSet: {
      bool written = false;
      torch::appendValue(out, table_.compareSet(command.keys[0], command.values[0], command.values[1], &written));
      send(c, std::move(out));
      if (written) wake(command.keys[0]);
      return;
    }
    case torch::Query::kGet: {
      const Bytes* value = table_.find(command.keys[0]);
      torch::appendValue(out, value != nullptr ? *value : Bytes());
      break;
    }
    case torch::Query::kAdd: {
      int64_t sum = 0;
      try {
        sum = table_.add(command.keys[0], command.number);
      } catch (const InvalidArgument& e) {
        // torch's client has no error reply to read: the connection is all it can lose.
        RINGTREE_WARN("TCPStore server on port " << port_ << ": closing torch client " << c.peer << ": ADD: "
                                                 << e.what());
        return scheduleClose(c, std::string("ADD: ") + e.what());
      }
      torch::appendI64(out, sum);
      send(c, std::move(out));
      wake(command.keys[0]);
      return;
    }
    case torch::Query::kCheck:
      torch::appendU8(out, table_.firstMissing(command.keys) == nullptr ? torch::kReady : torch::kNotReady);
      break;
    case torch::Query::kWait:
      startTorchWait(c, std::move(command.keys));
      return;
    case torch::Query::kGetNumKeys:
      torch::appendI64(out, static_cast<int64_t>(table_.size()));
      break;
    case torch::Query::kDeleteKey:
      torch::appendI64(out, table_.erase(command.keys[0]) ? 1 : 0);
      break;
    case torch::Query::kAppend:
      table_.append(command.keys[0], command.values[0]);
      wake(command.keys[0]);
      return;
    case torch::Query::kMultiGet: {
      // The same bound as a ringtree GET's reply.
      uint64_t size = 0;
      for (const auto& key : command.keys) {
        const Bytes* value = table_.find(key);
        size += 8 + (value != nullptr ? value->size() : 0);
      }
      if (size > kMaxMultiGetReplyBytes) {
        return scheduleClose(c, "MULTI_GET of " + std::to_string(command.keys.size()) + " keys would reply " +
                                    std::to_string(size) + " bytes, more than one reply may carry (4 GiB)");
      }
      for (const auto& key : command.keys) {
        const Bytes* value = table_.find(key);
        torch::appendValue(out, value != nullptr ? *value : Bytes());
      }
      break;
    }
    case torch::Query::kMultiSet:
      for (size_t i = 0; i < command.keys.size(); ++i) table_.set(command.keys[i], std::move(command.values[i]));
      for (const auto& key : command.keys) wake(key);
      return;
    case torch::Query::kCancelWait:
      // Answered whether or not a wait is pending: the client reads the kStopWaiting of a
      // wait answered meanwhile first, then this.
      unpark(c);
      torch::appendU8(out, torch::kWaitCanceled);
      break;
  }
  send(c, std::move(out));
}

void TcpStoreServer::Impl::startTorchWait(Connection& c, std::vector<std::string> keys) {
  const std::string* missing = table_.firstMissing(keys);
  if (missing == nullptr) {
    send(c, Bytes{torch::kStopWaiting});
    return;
  }
  // torch's client keeps the deadline itself and sends kCancelWait when it passes.
  std::string parkedOn = *missing;
  park(c, Waiter{tcp_store_protocol::Op::kWait, std::move(keys), std::move(parkedOn)}, net::kNoDeadline);
}

}  // namespace ringtree
