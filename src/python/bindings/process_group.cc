#include "process_group.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/error.h>
#include <ringtree/process_group.h>
#include <ringtree/store/store.h>

#include "buffers.h"
#include "engine_calls.h"
#include "process_group_calls.h"

namespace py = pybind11;

// The ProcessGroup class of ringtree._C: its methods are the calls of process_group_calls.h,
// the hot ones replaced by vectorcall methods (engine_calls.h).
namespace ringtree::python {

namespace {

using Microseconds = std::chrono::microseconds;

// A group's last reference may go away with the GIL held; its worker or progress thread
// may need the GIL to finish (releasing a buffer), so the group is destroyed without it.
std::shared_ptr<ProcessGroup> releasedWithoutGil(std::shared_ptr<ProcessGroup> group) {
  ProcessGroup* raw = group.get();
  return std::shared_ptr<ProcessGroup>(raw, [owner = std::move(group)](ProcessGroup*) mutable {
    if (pythonIsFinalizing()) {
      new std::shared_ptr<ProcessGroup>(std::move(owner));  // its threads may be blocked in Python: leak it
      return;
    }
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      owner.reset();
    } else {
      owner.reset();
    }
  });
}

}  // namespace

void initProcessGroup(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator",
                                                          "rank + size + one connection per peer (private API).")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("timeout", &Communicator::timeout)
      .def("transport_to", &Communicator::transportTo, py::arg("peer"),
           "'self', 'tcp' or 'shm': how this rank reaches peer.");

  py::object processGroup = py::class_<ProcessGroup, std::shared_ptr<ProcessGroup>>(m, "ProcessGroup", R"(The native backend of a group (private API).

Every collective and point-to-point call of the group enters here; arguments are checked
before anything moves. Collectives run in submission order; a synchronous one runs on the
calling thread when nothing is pending. Buffers are torch tensors, NumPy arrays or any
object with __dlpack__ or the buffer protocol, used in place; ranks are group ranks.)")
      .def_static(
          "create",
          [](std::shared_ptr<Store> store, int rank, int size, Microseconds timeout, const std::string& transport,
             const std::string& interface) {
            if (!store) {
              throw InvalidArgument("ProcessGroup.create needs a store, got None");
            }
            CommunicatorOptions options;
            options.transport = parseTransportKind(transport);
            options.interface = interface;
            options.timeout = calls::toMilliseconds(timeout);
            std::shared_ptr<ProcessGroup> group;
            {
              py::gil_scoped_release release;
              group = ProcessGroup::create(std::move(store), rank, size, options);
            }
            return releasedWithoutGil(std::move(group));
          },
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport") = "auto",
          py::arg("interface") = "",
          "Connects the group's ranks through store (a collective over the size ranks; keys under comm/); "
          "blocks until done.")
      .def_static(
          "create_over",
          [](const ProcessGroup& parent, const std::vector<int>& ranks, const std::string& name,
             std::shared_ptr<Store> store, Microseconds timeout) {
            if (!store) {
              throw InvalidArgument("ProcessGroup.create_over needs a store, got None");
            }
            CommunicatorOptions options;
            options.timeout = calls::toMilliseconds(timeout);
            std::shared_ptr<ProcessGroup> group;
            {
              py::gil_scoped_release release;
              group = ProcessGroup::createOver(parent, ranks, name, std::move(store), options);
            }
            return releasedWithoutGil(std::move(group));
          },
          py::arg("parent"), py::arg("ranks"), py::arg("name"), py::arg("store"), py::arg("timeout"),
          "A group of the parent ranks `ranks` (ranks[i] becomes group rank i) over parent's connections, on "
          "channels of its own: opens no connection, returns at once. Every member passes the same ranks and name.")
      .def("allreduce", &calls::allreduce, py::arg("tensor"), py::arg("op"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "In place: tensor <- op over every rank's tensor. Returns a Work if async_op, else None.")
      .def("broadcast", &calls::broadcast, py::arg("tensor"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(), "In place: tensor <- root's tensor.")
      .def("reduce", &calls::reduce, py::arg("tensor"), py::arg("root"), py::arg("op"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "In place on root: tensor <- op over every rank's tensor; the others' are left unchanged.")
      .def("allgather", &calls::allgather, py::arg("tensor_list"), py::arg("tensor"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "tensor_list[r] <- rank r's tensor (one buffer per rank; sizes may differ by rank).")
      .def("allgather_single", &calls::allgatherSingle, py::arg("output_tensor"), py::arg("input_tensor"),
           py::arg("async_op"), py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "output_tensor (world_size times input_tensor's size) <- every rank's input_tensor, in rank order.")
      .def("gather", &calls::gather, py::arg("tensor"), py::arg("gather_list"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "On root: gather_list[r] <- rank r's tensor; gather_list is None on the other ranks.")
      .def("scatter", &calls::scatter, py::arg("tensor"), py::arg("scatter_list"), py::arg("root"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "tensor <- root's scatter_list[rank]; scatter_list is None on the other ranks.")
      .def("reduce_scatter", &calls::reduceScatter, py::arg("output"), py::arg("input_list"), py::arg("op"),
           py::arg("async_op"), py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(), "output <- op over every rank's input_list[rank].")
      .def("reduce_scatter_single", &calls::reduceScatterSingle, py::arg("output"), py::arg("input"), py::arg("op"),
           py::arg("async_op"), py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "output <- op over every rank's part `rank` of input (world_size equal parts, end to end).")
      .def("alltoall", &calls::alltoall, py::arg("output_tensor_list"), py::arg("input_tensor_list"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(), "output_tensor_list[r] <- rank r's input_tensor_list[rank].")
      .def("alltoall_single", &calls::alltoallSingle, py::arg("output"), py::arg("input"),
           py::arg("output_split_sizes"), py::arg("input_split_sizes"), py::arg("async_op"),
           py::arg("algorithm") = py::none(), py::arg("timeout") = py::none(),
           "Part r of output <- part `rank` of rank r's input; parts are cut along dim 0, the split sizes' rows "
           "each (None or empty: world_size equal parts). input and output must not overlap.")
      .def("allreduce_coalesced", &calls::allreduceCoalesced, py::arg("tensors"), py::arg("op"), py::arg("async_op"), py::arg("timeout") = py::none(),
           "In place: every tensors[i] <- op over every rank's tensors[i], as one operation.")
      .def("allgather_coalesced", &calls::allgatherCoalesced, py::arg("output_tensor_lists"), py::arg("input_tensor_list"),
           py::arg("async_op"), py::arg("timeout") = py::none(), "output_tensor_lists[r][i] <- rank r's input_tensor_list[i], as one operation.")
      .def("allgather_single_coalesced", &calls::allgatherSingleCoalesced, py::arg("output_tensors"),
           py::arg("input_tensors"), py::arg("async_op"), py::arg("timeout") = py::none(),
           "allgather_single(output_tensors[i], input_tensors[i]) for every i, as one operation.")
      .def("reduce_scatter_single_coalesced", &calls::reduceScatterSingleCoalesced, py::arg("outputs"), py::arg("inputs"),
           py::arg("op"), py::arg("async_op"), py::arg("timeout") = py::none(),
           "reduce_scatter_single(outputs[i], inputs[i]) for every i, as one operation.")
      .def("barrier", &calls::barrier, py::arg("timeout"), py::arg("async_op"),
           "Returns once every rank entered the barrier (timeout: timedelta, or None for the group's).")
      .def("send", &calls::send, py::arg("tensor"), py::arg("dst"), py::arg("tag"),
           "Sends tensor to the group rank dst; returns once tensor may be reused.")
      .def("recv", &calls::recv, py::arg("tensor"), py::arg("src"), py::arg("tag"),
           "Receives into tensor from the group rank src (-1: any rank); returns the sender's group rank.")
      .def("isend", &calls::isend, py::arg("tensor"), py::arg("dst"), py::arg("tag"),
           "Sends tensor to the group rank dst; the Work completes when tensor may be reused.")
      .def("irecv", &calls::irecv, py::arg("tensor"), py::arg("src"), py::arg("tag"),
           "Receives into tensor from the group rank src (-1: any rank; Work.source_rank() names it).")
      .def("batch_isend_irecv", &calls::batchIsendIrecv, py::arg("ops"),
           "Posts (is_send, tensor, peer, tag) ops together, as torch's batch_isend_irecv; one Work per op.")
      .def("shutdown", &ProcessGroup::shutdown, py::call_guard<py::gil_scoped_release>(),
           "Refuses new operations, runs the queued collectives, stops the worker thread and fails pending "
           "point-to-point operations.")
      .def("abort", &ProcessGroup::abort, py::call_guard<py::gil_scoped_release>(),
           "Aborts the group: the running collective fails within about 100 ms, queued ones fail without running, "
           "and the connections and shared memory are released.")
      .def_property_readonly("rank", &ProcessGroup::rank)
      .def_property_readonly("size", &ProcessGroup::size)
      .def_property_readonly("communicator", &ProcessGroup::communicator, py::return_value_policy::reference_internal,
                             "The communicator of the group's collectives (diagnostics).")
      .def_property_readonly("is_shutdown", &ProcessGroup::isShutdown)
      .def_property_readonly("_inline_call_count", &ProcessGroup::inlineCallCount,
                             "How many synchronous collectives ran on the calling thread (a debug counter).");
  installEngineCalls(processGroup);
  m.attr("ANY_SOURCE") = ProcessGroup::kAnySource;
}

}  // namespace ringtree::python
