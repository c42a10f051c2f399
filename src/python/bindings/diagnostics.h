#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds the diagnostics of a communicator and its CPU engine (private API, used by
// ringtree.diagnostics and ringtree.process_group): the flight record as JSON, its dump
// into RINGTREE_FLIGHT_RECORDER_DIR, the identity that names the dumps, and abort.
// Needs the Communicator and ProcessGroup classes (initCollectives) registered first.
void initDiagnostics(pybind11::module_& m);

}  // namespace ringtree::python
