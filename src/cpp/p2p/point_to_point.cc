#include <ringtree/p2p.h>

#include <utility>

#include "p2p/engine.h"

namespace ringtree {

PointToPoint::PointToPoint(std::shared_ptr<Communicator> communicator)
    : engine_(std::make_shared<detail::PointToPointEngine>(std::move(communicator))) {}

// A Work::wait() driving the engine may hold it a little longer: it is shut down now all
// the same.
PointToPoint::~PointToPoint() { engine_->shutdown(); }

int PointToPoint::rank() const { return engine_->rank(); }

int PointToPoint::size() const { return engine_->size(); }

std::shared_ptr<Work> PointToPoint::isend(const void* data, size_t count, DataType type, int peer, int tag,
                                          std::shared_ptr<void> keepAlive) {
  return engine_->isend(data, count, type, peer, tag, std::move(keepAlive));
}

std::shared_ptr<Work> PointToPoint::irecv(void* data, size_t count, DataType type, int peer, int tag,
                                          std::shared_ptr<void> keepAlive) {
  return engine_->irecv(data, count, type, peer, tag, std::move(keepAlive));
}

void PointToPoint::send(const void* data, size_t count, DataType type, int peer, int tag) {
  engine_->send(data, count, type, peer, tag);
}

int PointToPoint::recv(void* data, size_t count, DataType type, int peer, int tag) {
  return engine_->recv(data, count, type, peer, tag);
}

void PointToPoint::shutdown() { engine_->shutdown(); }

}  // namespace ringtree
