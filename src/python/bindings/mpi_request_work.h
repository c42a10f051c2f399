#pragma once

#include <pybind11/pybind11.h>

// _MpiRequestWork: the Work of ringtree.mpi's isend/irecv, over one mpi4py Request, in C
// (see mpi_request_work.cc). Private API; GIL held everywhere.
namespace ringtree::python {

// What a request work needs of its group, held by the group's _MpiFastCalls (which each
// work keeps alive). Every member is a strong reference owned by that object.
struct RequestWorkHelpers {
  PyObject* engine;        // the MpiEngine: engine._describe(what, buffer) names a call
  PyObject* waiting;       // Progress.waiting: thread id -> the work it blocks on in wait()
  PyObject* progressAdd;   // Progress.add(work): completes a work nobody waits for
  PyObject* wrap;          // work._wrap(exception, text) -> the DistBackendError to raise
  PyObject* futureOf;      // work.future_of(work) -> its torch Future
  PyObject* runCallback;   // work._run_callback(callback, error or None)
  PyObject* timeoutError;  // DistTimeoutError
};

// A new work for the started MPI request `request` (stolen) of the call `what` (a static
// string) on `buffer` (the borrowed buffer, kept until the work dies) of `tensor` (what
// result() returns). `status` (stolen, may be null) is the MPI.Status of an any-source
// receive, which gives source_rank(); otherwise `source` is it (-1 for sends). `owner`
// holds `helpers`. Null with a Python error on failure.
PyObject* newRequestWork(PyObject* owner, const RequestWorkHelpers* helpers, const char* what, PyObject* request,
                         PyObject* status, PyObject* tensor, PyObject* buffer, long source, double deadline);

// Adds _MpiRequestWork to the module.
void initRequestWork(pybind11::module_& m);

}  // namespace ringtree::python
