#pragma once

#include <memory>
#include <vector>

#include "arena/node_arena.h"
#include "common/socket.h"
#include "transport/pair.h"

// The node arena of a communicator made over shared connections (Communicator::
// createOver), which has no rendezvous of its own to hand a segment over in: the offer and
// the answers travel on the communicator's own pairs, and the segment is opened through
// /proc.
namespace ringtree::rendezvous {

// Collective over the communicator's `size` ranks, whose members all run on this host and
// reach each other over shared memory (pairs[r]: the pair to rank r, null at `rank`),
// before its first collective. Rank 0 creates a NodeArena and offers it to every other
// rank: its pid, the memfd's descriptor number, inode and device. Each opens
// /proc/<pid>/fd/<descriptor> (a process of the same user may; a process that may not,
// or a pid of another namespace, answers no), checks that the file is the one offered,
// maps it, and answers; rank 0 then tells every rank whether all could. Returns the arena
// on every rank, or null on every rank when one could not.
//
// Blocks until every rank took part or `deadline` passes. Throws TimeoutError naming the
// ranks that did not answer in time, and what the pairs throw (NetworkError,
// CollectiveMismatchError for a message that is no part of this exchange).
// `allowed` false (RINGTREE_SHM_ARENA=0 on this rank): this rank takes part, and offers
// nothing or answers no.
std::shared_ptr<arena::NodeArena> shareNodeArena(const std::vector<transport::Pair*>& pairs, int rank, int size,
                                                 bool allowed, net::Deadline deadline);

}  // namespace ringtree::rendezvous
