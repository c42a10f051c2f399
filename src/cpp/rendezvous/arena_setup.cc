#include "rendezvous/arena_setup.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include <ringtree/error.h>

#include "common/logging.h"
#include "common/socket.h"
#include "common/text.h"
#include "transport/shm/unix_socket.h"

namespace ringtree::rendezvous {

namespace {

using Clock = net::Clock;

// The hand-over's messages, host byte order: rank r > 0 connects to rank 0's listener
// and sends an ArenaHello; rank 0 answers with an ArenaGrant, the memfd attached.
constexpr uint32_t kArenaHelloMagic = 0x314e5452;  // "RTN1"
constexpr uint32_t kArenaGrantMagic = 0x31475452;  // "RTG1"

struct ArenaHello {
  uint32_t magic = kArenaHelloMagic;
  int32_t rank = -1;
  Nonce nonce{};
};
static_assert(sizeof(ArenaHello) == 24, "ArenaHello is part of the wire format");

struct ArenaGrant {
  uint32_t magic = kArenaGrantMagic;
  int32_t size = 0;
  uint64_t slotBytes = 0;
};
static_assert(sizeof(ArenaGrant) == 16, "ArenaGrant is part of the wire format");

// ArenaGrant::size of the answer to a request that comes after the arena was handed out.
constexpr int32_t kLateRequest = -1;

std::string arenaKey(int rank) { return "rt/comm/arena/" + std::to_string(rank); }

// Whether every rank voted for the arena (this rank's vote included).
bool everyRankVotesFor(const ArenaSetup& setup, bool vote) {
  const Phase& phase = setup.phase;
  setup.store.set(arenaKey(phase.rank), Bytes{static_cast<uint8_t>(vote ? 1 : 0)});
  std::vector<std::string> keys;
  for (int r = 0; r < phase.size; ++r) keys.push_back(arenaKey(r));
  try {
    setup.store.wait(keys, phase.remaining());
  } catch (const StoreError& e) {
    throw StoreError("rank " + std::to_string(phase.rank) + ": not every rank said within " +
                     std::to_string(phase.elapsedMs()) +
                     " ms whether it can use a node arena (store keys 'rt/comm/arena/<rank>'): " + e.what());
  }
  for (const Bytes& value : setup.store.multiGet(keys)) {
    if (value != Bytes{1}) return false;
  }
  return true;
}

// Rank 0: creates the arena and hands it to every other rank.
std::shared_ptr<arena::NodeArena> grantArena(const ArenaSetup& setup) {
  const Phase& phase = setup.phase;
  const int size = phase.size;
  std::shared_ptr<arena::NodeArena> arena;
  try {
    arena = arena::NodeArena::create(size);
  } catch (const NetworkError& e) {
    throw NetworkError("rank 0: cannot create the node arena for " + std::to_string(size) + " ranks: " + e.what());
  }
  const ArenaGrant grant{kArenaGrantMagic, size, arena->slotBytes()};
  std::vector<bool> granted(static_cast<size_t>(size), false);
  for (int missing = size - 1; missing > 0;) {
    net::Socket socket;
    try {
      socket = setup.listener.accept(phase.deadline);
    } catch (const Error& e) {
      std::vector<int> ranks;
      for (int r = 1; r < size; ++r) {
        if (!granted[static_cast<size_t>(r)]) ranks.push_back(r);
      }
      throw NetworkError("rank 0: " + text::rankList(ranks) + " did not ask for the node arena within " +
                         std::to_string(phase.elapsedMs()) + " ms: " + e.what());
    }
    // A rank done with its setup may dial this one for its pair already: its handshake
    // (another magic) is kept for the connector.
    const net::Deadline helloDeadline = std::min(phase.deadline, Clock::now() + kHelloTimeout);
    uint32_t magic = 0;
    net::IoResult io = net::recvAll(socket.fd(), &magic, sizeof(magic), helloDeadline);
    if (io.ok() && magic == Hello::kMagic) {
      EarlyHello early{std::move(socket), Hello{}, /*sharedMemory=*/true};
      io = net::recvAll(early.socket.fd(), reinterpret_cast<uint8_t*>(&early.hello) + sizeof(magic),
                        sizeof(Hello) - sizeof(magic), helloDeadline);
      if (io.ok()) setup.early->push_back(std::move(early));
      continue;
    }
    ArenaHello hello;
    if (io.ok()) {
      hello.magic = magic;
      io = net::recvAll(socket.fd(), reinterpret_cast<uint8_t*>(&hello) + sizeof(magic), sizeof(hello) - sizeof(magic),
                        helloDeadline);
    }
    if (!io.ok() || hello.magic != kArenaHelloMagic || hello.nonce != setup.nonce || hello.rank <= 0 ||
        hello.rank >= size || granted[static_cast<size_t>(hello.rank)]) {
      RINGTREE_DEBUG("rank 0: rejecting a node arena request without a valid handshake");
      continue;
    }
    const net::IoResult sent =
        transport::shm::sendWithDescriptor(socket.fd(), &grant, sizeof(grant), arena->descriptor(), phase.deadline);
    if (!sent.ok()) {
      throw NetworkError("rank 0: handing the node arena to " +
                         describePeer(hello.rank, setup.records[static_cast<size_t>(hello.rank)], true) +
                         " failed: " + sent.describe());
    }
    granted[static_cast<size_t>(hello.rank)] = true;
    --missing;
  }
  arena->closeDescriptor();
  return arena;
}

// Rank > 0: asks rank 0 for the arena and maps it.
std::shared_ptr<arena::NodeArena> receiveArena(const ArenaSetup& setup) {
  const Phase& phase = setup.phase;
  const std::string self = "rank " + std::to_string(phase.rank);
  const PeerRecord& root = setup.records[0];
  const std::string peer = describePeer(0, root, true);
  std::string error;
  net::Socket socket = transport::shm::connect(root.shmName, phase.deadline, &error);
  if (!socket.valid()) throw NetworkError(self + " cannot ask " + peer + " for the node arena: " + error);
  ArenaHello hello;
  hello.rank = phase.rank;
  hello.nonce = setup.nonce;
  net::IoResult io = net::sendAll(socket.fd(), &hello, sizeof(hello), phase.deadline);
  ArenaGrant grant;
  transport::shm::Ancillary ancillary;
  if (io.ok()) io = transport::shm::recvWithDescriptor(socket.fd(), &grant, sizeof(grant), phase.deadline, &ancillary);
  if (!io.ok()) throw NetworkError(self + ": receiving the node arena from " + peer + " failed: " + io.describe());
  if (grant.magic == kArenaGrantMagic && grant.size == kLateRequest) {
    throw NetworkError(self + " cannot join the node arena of rank 0 (" + describeLiveRecord(root) + "): that process finished its rendezvous before " +
                       "this one started, so its record is from an earlier job whose processes linger (a relaunch " +
                       "on the same MASTER_ADDR:MASTER_PORT or store?). Stop pid " +
                       std::to_string(root.process.pid) + " or give this job a store of its own");
  }
  if (grant.magic != kArenaGrantMagic || grant.size != phase.size || !ancillary.descriptor.valid() ||
      ancillary.extraDescriptors != 0) {
    throw NetworkError(self + ": " + peer + " answered the node arena request with something other than one arena of " +
                       std::to_string(phase.size) + " slots");
  }
  try {
    return arena::NodeArena::attach(std::move(ancillary.descriptor), phase.rank, phase.size, grant.slotBytes);
  } catch (const Error& e) {
    throw NetworkError(self + ": cannot map the node arena of " + peer + ": " + e.what());
  }
}

}  // namespace

bool isArenaRequest(uint32_t magic) { return magic == kArenaHelloMagic; }

void refuseLateArenaRequest(net::Socket socket) {
  const ArenaGrant refusal{kArenaGrantMagic, kLateRequest, 0};
  const net::IoResult io = net::sendAll(socket.fd(), &refusal, sizeof(refusal), net::deadlineAfter(kHelloTimeout));
  if (!io.ok()) RINGTREE_DEBUG("answering a late node arena request failed: " << io.describe());
}

bool arenaPossible(const std::vector<PeerRecord>& records) {
  for (const PeerRecord& r : records) {
    if (r.transport == TransportKind::kTcp || r.shmName.empty() || !sameHost(r.process, records[0].process)) return false;
  }
  return true;
}

std::shared_ptr<arena::NodeArena> setUpNodeArena(const ArenaSetup& setup, bool vote) {
  if (!everyRankVotesFor(setup, vote)) return nullptr;
  return setup.phase.rank == 0 ? grantArena(setup) : receiveArena(setup);
}

}  // namespace ringtree::rendezvous
