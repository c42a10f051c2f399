#include "p2p.h"

#include <memory>
#include <utility>

#include <ringtree/communicator.h>
#include <ringtree/error.h>
#include <ringtree/p2p.h>
#include <ringtree/work.h>

#include "buffers.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

void destroyPointToPoint(PointToPoint* engine) {
  if (pythonIsFinalizing()) {
    return;  // its progress thread may be releasing a buffer through Python: leak it
  }
  if (PyGILState_Check()) {
    py::gil_scoped_release release;  // releasing a buffer-protocol view takes the GIL
    delete engine;
  } else {
    delete engine;
  }
}

// The buffer is borrowed with the GIL held and owned by the Work until it completes; the
// engine is entered without the GIL, since its progress thread may need it to release a
// finished operation's buffer.
std::shared_ptr<Work> isend(PointToPoint& engine, py::handle tensor, int peer, int tag) {
  auto buffer = std::make_shared<Buffer>(tensor, Access::kRead, "isend");
  const void* data = buffer->data();
  const size_t count = buffer->count();
  const DataType type = buffer->type();
  py::gil_scoped_release release;
  return engine.isend(data, count, type, peer, tag, std::move(buffer));
}

std::shared_ptr<Work> irecv(PointToPoint& engine, py::handle tensor, int peer, int tag) {
  auto buffer = std::make_shared<Buffer>(tensor, Access::kReadWrite, "irecv");
  void* data = buffer->data();
  const size_t count = buffer->count();
  const DataType type = buffer->type();
  py::gil_scoped_release release;
  return engine.irecv(data, count, type, peer, tag, std::move(buffer));
}

// Blocking: the buffer is borrowed for the call only; the engine runs without the GIL (on
// this thread when nothing else is pending with the peer), and the buffer is released
// after the GIL is taken back (`release` is destroyed first).
void send(PointToPoint& engine, py::handle tensor, int peer, int tag) {
  const Buffer buffer(tensor, Access::kRead, "send");
  py::gil_scoped_release release;
  engine.send(buffer.data(), buffer.count(), buffer.type(), peer, tag);
}

int recv(PointToPoint& engine, py::handle tensor, int peer, int tag) {
  const Buffer buffer(tensor, Access::kReadWrite, "recv");
  py::gil_scoped_release release;
  return engine.recv(buffer.data(), buffer.count(), buffer.type(), peer, tag);
}

}  // namespace

void initPointToPoint(py::module_& m) {
  py::class_<PointToPoint, std::shared_ptr<PointToPoint>>(m, "PointToPoint", R"(Point-to-point messages between the
ranks of a group (private API).

Owns its communicator, which must be one made for it. A receive takes the oldest message
from its peer with its tag (any peer with peer=-1); message and receive must agree on
dtype and element count. Every call returns a Work at once; the buffer is used in place
and must stay untouched until the Work completed.)")
      .def(py::init([](std::shared_ptr<Communicator> communicator) {
             if (!communicator) {
               throw InvalidArgument("PointToPoint needs a communicator, got None");
             }
             py::gil_scoped_release release;
             return std::shared_ptr<PointToPoint>(new PointToPoint(std::move(communicator)), destroyPointToPoint);
           }),
           py::arg("communicator"))
      .def("isend", &isend, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           "Sends tensor to the group rank peer; the Work completes when tensor may be reused.")
      .def("irecv", &irecv, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           "Receives into tensor from the group rank peer (-1: any rank; Work.source_rank() names it).")
      .def("send", &send, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           "Sends tensor to the group rank peer; returns once tensor may be reused.")
      .def("recv", &recv, py::arg("tensor"), py::arg("peer"), py::arg("tag"),
           "Receives into tensor from the group rank peer (-1: any rank); returns the sender's group rank.")
      .def("shutdown", &PointToPoint::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Fails every pending operation and refuses new ones. Idempotent.")
      .def_property_readonly("rank", &PointToPoint::rank)
      .def_property_readonly("size", &PointToPoint::size);
  m.attr("ANY_SOURCE") = PointToPoint::kAnySource;
}

}  // namespace ringtree::python
