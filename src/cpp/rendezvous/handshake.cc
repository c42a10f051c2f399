#include "rendezvous/handshake.h"

namespace ringtree::rendezvous {

Hello makeHello(int sender, int receiver, HelloTransport transport, const Nonce& nonce) {
  Hello h;
  h.transport = static_cast<uint8_t>(transport);
  h.senderRank = sender;
  h.receiverRank = receiver;
  h.nonce = nonce;
  return h;
}

bool validHello(const Hello& h, const Nonce& nonce, int receiver, int size, int sender, bool answer) {
  const auto last = answer ? HelloTransport::kGaveUp : HelloTransport::kShmUnreachable;
  return h.magic == Hello::kMagic && h.version == Hello::kVersion && h.nonce == nonce && h.receiverRank == receiver &&
         h.senderRank >= 0 && h.senderRank < size && h.senderRank != receiver &&
         (sender < 0 || h.senderRank == sender) && h.transport >= static_cast<uint8_t>(HelloTransport::kTcp) &&
         h.transport <= static_cast<uint8_t>(last);
}

}  // namespace ringtree::rendezvous
