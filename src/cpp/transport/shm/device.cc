#include "transport/shm/device.h"

#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <new>
#include <string>

#include <ringtree/error.h>

#include "common/logging.h"
#include "transport/shm/pair.h"
#include "transport/shm/protocol.h"
#include "transport/shm/unix_socket.h"

namespace ringtree::transport::shm {

namespace {

// How our segments appear in /proc/<pid>/maps ("/memfd:ringtree-shm (deleted)").
constexpr const char* kSegmentName = "ringtree-shm";

Prefault prefaultOf(const PairOptions& options) { return options.prefault ? Prefault::kYes : Prefault::kNo; }

// Under Yama ptrace_scope 1 only ancestors may process_vm_readv a process unless it
// names a ptracer; allow any process of our uid (the kernel still requires the same uid
// and no privilege escalation). A no-op elsewhere. Per process: a forked child does it
// again (Yama exceptions are not inherited).
void allowPeerReadsUnderYama() {
  static std::atomic<pid_t> donePid{0};
  const pid_t self = ::getpid();
  if (donePid.load(std::memory_order_relaxed) == self) return;
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (scope >> value && value == 1) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  donePid.store(self, std::memory_order_relaxed);
}

uint64_t randomWord() {
  uint64_t value = 0;
  if (::getrandom(&value, sizeof(value), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(value))) {
    value = static_cast<uint64_t>(net::Clock::now().time_since_epoch().count()) ^ static_cast<uint64_t>(::getpid());
  }
  return value | 1;  // never 0, which a zeroed page would also hold
}

bool validRingBytes(uint64_t bytes) {
  return bytes >= kMinRingBytes && bytes <= kMaxRingBytes && bytes % kCacheLineBytes == 0;
}

// Whether we can read the peer's probe word (the kernel allows process_vm_readv into it).
bool probeDirectRead(pid_t pid, const Hello& hello) {
  if (pid <= 0) return false;
  uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(hello.probeAddress)), sizeof(value)};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof(value)) &&
         value == hello.probeValue;
}

}  // namespace

// The handshake is symmetric (both sides send first, then receive; everything fits in the
// socket buffers), so `initiator` does not change it.
std::unique_ptr<Pair> createPair(net::Socket socket, bool /*initiator*/, int selfRank, int peerRank,
                                 const std::string& peerDescription, const PairOptions& options,
                                 net::Deadline deadline) {
  if (options.ringBytes < kMinRingBytes || options.ringBytes > kMaxRingBytes) {
    throw InvalidArgument("shm PairOptions::ringBytes must be between " + std::to_string(kMinRingBytes) + " and " +
                          std::to_string(kMaxRingBytes) + ", got " + std::to_string(options.ringBytes));
  }
  const auto failure = [&](const std::string& what) {
    return NetworkError("shared-memory connection to " + peerDescription + ": " + what);
  };
  if (!socket.valid()) throw failure("no connected socket");
  const size_t ringBytes = alignToCacheLine(options.ringBytes);

  try {
    net::setNonBlocking(socket.fd());
  } catch (const NetworkError& e) {
    throw failure(e.what());
  }
  const int one = 1;
  if (::setsockopt(socket.fd(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) {
    throw failure("cannot enable SO_PASSCRED: " + net::errnoText(errno));
  }
  ucred peerCredentials{};
  socklen_t length = sizeof(peerCredentials);
  if (::getsockopt(socket.fd(), SOL_SOCKET, SO_PEERCRED, &peerCredentials, &length) != 0) {
    throw failure("cannot read the peer's credentials (SO_PEERCRED): " + net::errnoText(errno));
  }
  if (peerCredentials.uid != ::geteuid()) {
    throw failure("the peer process (pid " + std::to_string(peerCredentials.pid) + ") runs as uid " +
                  std::to_string(peerCredentials.uid) + ", this one as uid " + std::to_string(::geteuid()));
  }
  allowPeerReadsUnderYama();

  PairSetup setup;
  setup.txRingBytes = ringBytes;
  try {
    setup.tx = Segment::create(kSegmentName, kRingOffset + ringBytes, prefaultOf(options));
  } catch (const NetworkError& e) {
    throw failure(e.what());
  }
  auto* control = new (setup.tx.data()) RingControl;
  control->magic = kMagic;
  control->version = kProtocolVersion;
  control->reserved = 0;
  control->ringBytes = ringBytes;
  control->head.store(0, std::memory_order_relaxed);
  control->writerSleeping.store(0, std::memory_order_relaxed);
  control->tail.store(0, std::memory_order_relaxed);
  control->readerSleeping.store(0, std::memory_order_relaxed);

  // The peer reads this word while we wait for its answer below, so it outlives the probe.
  volatile uint64_t probeWord = randomWord();
  Hello hello{};
  hello.magic = kMagic;
  hello.version = kProtocolVersion;
  hello.rank = selfRank;
  hello.peerRank = peerRank;
  hello.ringBytes = ringBytes;
  hello.probeAddress = reinterpret_cast<uintptr_t>(&probeWord);
  hello.probeValue = probeWord;
  net::IoResult io = sendWithDescriptor(socket.fd(), &hello, sizeof(hello), setup.tx.descriptor(), deadline);
  if (!io.ok()) throw failure("sending the handshake: " + io.describe());

  Hello peer{};
  Ancillary ancillary;
  io = recvWithDescriptor(socket.fd(), &peer, sizeof(peer), deadline, &ancillary);
  if (!io.ok()) throw failure("receiving the handshake: " + io.describe());
  if (peer.magic != kMagic) throw failure("the peer is not a ringtree shared-memory endpoint");
  if (peer.version != kProtocolVersion) {
    throw failure("protocol version " + std::to_string(peer.version) + ", this process speaks " +
                  std::to_string(kProtocolVersion));
  }
  if (peer.rank != peerRank || peer.peerRank != selfRank) {
    throw failure("the peer is rank " + std::to_string(peer.rank) + " expecting rank " + std::to_string(peer.peerRank) +
                  ", but this is rank " + std::to_string(selfRank) + " expecting rank " + std::to_string(peerRank));
  }
  if (!validRingBytes(peer.ringBytes)) throw failure("invalid ring size " + std::to_string(peer.ringBytes));
  if (!ancillary.descriptor.valid() || ancillary.extraDescriptors != 0) {
    throw failure("expected one shared memory segment, got " +
                  std::to_string(ancillary.extraDescriptors + (ancillary.descriptor.valid() ? 1 : 0)));
  }
  try {
    setup.rx = Segment::map(std::move(ancillary.descriptor), kRingOffset + peer.ringBytes, prefaultOf(options));
  } catch (const NetworkError& e) {
    throw failure(e.what());
  }
  const auto* peerControl = reinterpret_cast<const RingControl*>(setup.rx.data());
  if (peerControl->magic != kMagic || peerControl->version != kProtocolVersion ||
      peerControl->ringBytes != peer.ringBytes) {
    throw failure("the peer's segment does not hold the ring it announced");
  }
  setup.rxRingBytes = peer.ringBytes;
  setup.peerPid = ancillary.credentials.pid;

  setup.weReadDirect = probeDirectRead(setup.peerPid, peer);
  const uint8_t answer = setup.weReadDirect ? 1 : 0;
  io = net::sendAll(socket.fd(), &answer, 1, deadline);
  if (!io.ok()) throw failure("sending the direct-copy probe result: " + io.describe());
  uint8_t peerAnswer = 0;
  io = net::recvAll(socket.fd(), &peerAnswer, 1, deadline);
  if (!io.ok()) throw failure("receiving the direct-copy probe result: " + io.describe());
  setup.peerReadsDirect = peerAnswer == 1;

  setup.tx.closeDescriptor();
  setup.rx.closeDescriptor();
  setup.socket = std::move(socket);
  RINGTREE_DEBUG("shm pair to " << peerDescription << " (pid " << setup.peerPid << "): rings " << ringBytes << " / "
                                << setup.rxRingBytes << " bytes, direct copy out "
                                << (setup.peerReadsDirect ? "yes" : "no") << ", in "
                                << (setup.weReadDirect ? "yes" : "no"));
  return std::make_unique<ShmPair>(std::move(setup), peerRank, peerDescription, options);
}

}  // namespace ringtree::transport::shm
