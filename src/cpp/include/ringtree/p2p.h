#pragma once

#include <cstddef>
#include <memory>

#include <ringtree/communicator.h>
#include <ringtree/export.h>
#include <ringtree/types.h>
#include <ringtree/work.h>

namespace ringtree {

namespace detail {
class PointToPointEngine;
}

// Point-to-point messages between the ranks of a communicator: torch's send, recv,
// isend, irecv and batch_isend_irecv. It owns its communicator: give it one made for it
// (a PrefixStore of its own), so that its traffic never mixes with collectives.
//
// Matching. A receive from `peer` with `tag` takes the oldest message that peer sent with
// that tag and that no earlier receive took: messages between two ranks with one tag
// arrive in send order; messages with different tags may be received in any order. A
// receive from kAnySource takes the oldest such message from whichever rank (the Work's
// sourceRank() names it). A message and the receive that takes it must have the same
// DataType and count, else the receive fails with CollectiveMismatchError naming both
// ranks, the tag and both (type, count), and so does the send when it is still pending
// (a send that already completed: the sender's next operation with that rank).
//
// Buffers are used in place: a send's bytes go to the transport from the caller's buffer
// (no staging copy for messages the receiver has posted for; small messages that arrive
// before their receive is posted are held in a buffer of their own), a receive's bytes
// land in the caller's buffer. Buffers must stay valid until their Work completes;
// `keepAlive` is held until then.
//
// Progress runs on a thread of the engine (started on first use) for isend/irecv; what an
// isend/irecv cannot finish at once is left for 200 us (up to about 1 ms when the thread
// was idle) to a Work::wait() that drives it (below) before that thread takes it over, so
// a prompt wait() costs no thread wake-up; one given a callback is the thread's at once. The
// blocking send/recv make progress on the calling thread instead whenever the engine has
// nothing else pending with that peer (for a receive from kAnySource: nothing at all):
// no thread hand-off, no Work, no copy beyond the transport's. Otherwise they queue like
// isend/irecv and wait for the progress thread (still without a Work). Work::wait() on
// an isend/irecv's Work likewise drives its peer (every peer, for kAnySource) on the
// waiting thread unless another caller already does, until the Work completes or the
// wait times out, and leaves the rest to the progress thread. A send's Work
// completes (send returns) when its buffer may be reused, a receive's when the data is in
// place.
//
// Errors (stored in the Works, thrown by send/recv; the calls themselves throw
// InvalidArgument for a peer out of range, the own rank, a negative tag or a null buffer
// with count > 0):
// NetworkError naming the peer when its connection breaks (every pending operation with
// that peer, and receives from kAnySource, fail; later ones with it fail at once);
// TimeoutError when an operation is still pending after the communicator's timeout.
// A peer that shuts down tells this rank so: operations with it fail with NetworkError,
// but receives from kAnySource keep waiting for the other ranks (they fail once no rank
// is left that could send). A mismatch, or a timeout of an operation whose bytes were
// already moving (a send, or a receive whose message had started to arrive), gives up
// the connection with that peer: its other operations, pending and later, fail too.
// A message that had arrived completely before its connection failed can still be
// received.
//
// Threading: every member function may be called from any thread, concurrently; the
// PointToPoint must outlive every call. A Work callback may call isend/irecv (it may run
// on the progress thread or inside isend/irecv/send/recv), but not send/recv (on the
// progress thread they throw InvalidArgument: they could wait for themselves), and must
// not destroy the PointToPoint unless that is the last thing it does with it.
class RINGTREE_API PointToPoint {
 public:
  static constexpr int kAnySource = -1;

  explicit PointToPoint(std::shared_ptr<Communicator> communicator);
  // shutdown().
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  int rank() const;
  int size() const;

  std::shared_ptr<Work> isend(const void* data, size_t count, DataType type, int peer, int tag,
                              std::shared_ptr<void> keepAlive = nullptr);
  std::shared_ptr<Work> irecv(void* data, size_t count, DataType type, int peer, int tag,
                              std::shared_ptr<void> keepAlive = nullptr);

  // Blocking forms of isend/irecv, with the same matching and arguments: send returns
  // once `data` may be reused (not necessarily once the peer received it), recv once the
  // message is in `data`, returning the rank it came from (`peer`, or the sender for
  // kAnySource). Both throw what the Work would hold: NetworkError, TimeoutError (after
  // the communicator's timeout), CollectiveMismatchError, Error after shutdown() (also
  // when shutdown() is called from another thread while they wait).
  void send(const void* data, size_t count, DataType type, int peer, int tag);
  int recv(void* data, size_t count, DataType type, int peer, int tag);

  // Fails every pending operation with Error("... shut down"), stops the progress thread,
  // refuses new operations (Error) and tells every peer that nothing more comes from this
  // rank. Idempotent; returns promptly.
  void shutdown();

 private:
  std::shared_ptr<detail::PointToPointEngine> engine_;  // and weakly by its Works
};

}  // namespace ringtree
