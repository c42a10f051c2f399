#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include <ringtree/work.h>

namespace ringtree::python {

// Binds Work with torch 2.13's Work API: wait(timeout), is_completed(), is_success(),
// exception(), source_rank(), result(), get_future() and synchronize().
void initWork(pybind11::module_& m);

// The Work of an asynchronous call as Python sees it (a ringtree.Work of its own, even
// for a C++ Work that several calls share): `outputs` (the tensors the operation writes)
// kept for result() and get_future(). GIL held.
pybind11::object pythonWork(std::shared_ptr<Work> work, pybind11::list outputs);
// The same for an operation that writes (or sends) one tensor: result() is [tensor], a list
// made only when asked for.
pybind11::object pythonWorkOn(std::shared_ptr<Work> work, pybind11::handle tensor);
// pythonWorkOn in two steps, for a call whose operation must hold the tensor: the state
// (a reference to `tensor`, released where its last owner lets go, taking the GIL there)
// made before the operation is posted, which may keep it alive, then the Python Work's.
std::shared_ptr<void> oneTensorState(pybind11::handle tensor);
pybind11::object pythonWorkWithState(std::shared_ptr<Work> work, std::shared_ptr<void> state);

}  // namespace ringtree::python
