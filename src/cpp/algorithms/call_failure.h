#pragma once

#include "algorithms/call.h"
#include "communicator_impl.h"
#include "transport/pair.h"

// What the call life cycle (call.cc) takes from the failure handling (call_failure.cc).
namespace ringtree::algorithms {

// A call on a communicator that an earlier failure broke: throws an error of that
// failure's class, repeating its text after the new call's description.
[[noreturn]] void throwBroken(const detail::CommunicatorImpl& comm, const transport::Envelope& envelope);

// The StallCheck of a call's waits (context: the Call): reads what the peers published
// (the node arena, else the store) and, for a peer in another call under this call's
// sequence number (a mismatch that no message reveals, such as two ranks that each wait
// for the other as the root of a reduce), throws what failCall turns into a
// CollectiveMismatchError naming both calls.
void checkPeersCalls(void* context);

inline detail::StallCheck stallCheckOf(Call& call) { return {&checkPeersCalls, &call}; }

}  // namespace ringtree::algorithms
