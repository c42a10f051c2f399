#include <pybind11/pybind11.h>

#include <ringtree/version.h>

#include "cuda.h"
#include "diagnostics.h"
#include "errors.h"
#include "foreign_store.h"
#include "front_calls.h"
#include "mpi_support.h"
#include "process_group.h"
#include "store.h"
#include "work.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringtree native core (C++); use the ringtree package, not this module";
  m.attr("__version__") = RINGTREE_VERSION_STRING;
  ringtree::python::initErrors(m);
  ringtree::python::initStore(m);
  ringtree::python::initForeignStore(m);
  ringtree::python::initWork(m);
  ringtree::python::initProcessGroup(m);
  ringtree::python::initFrontCalls(m);
  ringtree::python::initDiagnostics(m);
  ringtree::python::initMpiSupport(m);
  ringtree::python::initCuda(m);
}
