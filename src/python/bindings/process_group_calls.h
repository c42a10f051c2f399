#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>
#include <vector>

#include <ringtree/process_group.h>

// The calls of ringtree._C.ProcessGroup with the arguments Python passes (buffers as the
// objects given; see buffers.h), converted for the core: each borrows its buffers, parses
// op/algorithm/split sizes, runs the synchronous call with the GIL released (returns None,
// or recv's sender) or submits the asynchronous one (returns its Work, see work.h). Every
// check of the arguments themselves is ProcessGroup's. Both entries use them: the pybind11
// methods (process_group.cc) and the vectorcall methods (engine_calls.cc); implemented in
// process_group_calls.cc.
// The collectives' `timeout` is the call's deadline (none: the group's timeout; a zero one
// is refused). GIL held on entry; C++ exceptions propagate.
namespace ringtree::python::calls {

using Timeout = std::optional<std::chrono::microseconds>;

// A timedelta as the milliseconds of a deadline, rounded up so that a positive timeout
// never becomes "none" (0). Negative ones stay negative, for the core to refuse.
inline std::chrono::milliseconds toMilliseconds(std::chrono::microseconds timeout) {
  return std::chrono::ceil<std::chrono::milliseconds>(timeout);
}

pybind11::object allreduce(ProcessGroup& group, pybind11::handle tensor, pybind11::handle op, bool asyncOp,
                           pybind11::handle algorithm, const Timeout& timeout);
pybind11::object broadcast(ProcessGroup& group, pybind11::handle tensor, int root, bool asyncOp,
                           pybind11::handle algorithm, const Timeout& timeout);
pybind11::object reduce(ProcessGroup& group, pybind11::handle tensor, int root, pybind11::handle op, bool asyncOp,
                        pybind11::handle algorithm, const Timeout& timeout);
pybind11::object allreduceCoalesced(ProcessGroup& group, pybind11::handle tensors, pybind11::handle op, bool asyncOp,
                                    const Timeout& timeout);
pybind11::object allgather(ProcessGroup& group, pybind11::handle tensorList, pybind11::handle tensor, bool asyncOp,
                           pybind11::handle algorithm, const Timeout& timeout);
pybind11::object allgatherSingle(ProcessGroup& group, pybind11::handle outputTensor, pybind11::handle inputTensor,
                                 bool asyncOp, pybind11::handle algorithm, const Timeout& timeout);
pybind11::object allgatherCoalesced(ProcessGroup& group, pybind11::handle outputTensorLists,
                                    pybind11::handle inputTensorList, bool asyncOp, const Timeout& timeout);
pybind11::object allgatherSingleCoalesced(ProcessGroup& group, pybind11::handle outputTensors,
                                          pybind11::handle inputTensors, bool asyncOp, const Timeout& timeout);
pybind11::object gather(ProcessGroup& group, pybind11::handle tensor, pybind11::handle gatherList, int root,
                        bool asyncOp, pybind11::handle algorithm, const Timeout& timeout);
pybind11::object scatter(ProcessGroup& group, pybind11::handle tensor, pybind11::handle scatterList, int root,
                         bool asyncOp, pybind11::handle algorithm, const Timeout& timeout);
pybind11::object reduceScatter(ProcessGroup& group, pybind11::handle output, pybind11::handle inputList,
                               pybind11::handle op, bool asyncOp, pybind11::handle algorithm, const Timeout& timeout);
pybind11::object reduceScatterSingle(ProcessGroup& group, pybind11::handle output, pybind11::handle input,
                                     pybind11::handle op, bool asyncOp, pybind11::handle algorithm,
                                     const Timeout& timeout);
pybind11::object reduceScatterSingleCoalesced(ProcessGroup& group, pybind11::handle outputs, pybind11::handle inputs,
                                              pybind11::handle op, bool asyncOp, const Timeout& timeout);
pybind11::object alltoall(ProcessGroup& group, pybind11::handle outputTensorList, pybind11::handle inputTensorList,
                          bool asyncOp, pybind11::handle algorithm, const Timeout& timeout);
pybind11::object alltoallSingle(ProcessGroup& group, pybind11::handle output, pybind11::handle input,
                                pybind11::handle outputSplitSizes, pybind11::handle inputSplitSizes, bool asyncOp,
                                pybind11::handle algorithm, const Timeout& timeout);
pybind11::object barrier(ProcessGroup& group, const Timeout& timeout, bool asyncOp);
void send(ProcessGroup& group, pybind11::handle tensor, int dst, int tag);
int recv(ProcessGroup& group, pybind11::handle tensor, int src, int tag);
pybind11::object isend(ProcessGroup& group, pybind11::handle tensor, int dst, int tag);
pybind11::object irecv(ProcessGroup& group, pybind11::handle tensor, int src, int tag);
// ops: (is_send, tensor, peer, tag) tuples, posted together; one Work each.
pybind11::list batchIsendIrecv(ProcessGroup& group, const std::vector<pybind11::tuple>& ops);

}  // namespace ringtree::python::calls
