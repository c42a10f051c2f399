#include <pybind11/pybind11.h>

#include <ringtree/version.h>

#include "collectives.h"
#include "diagnostics.h"
#include "errors.h"
#include "p2p.h"
#include "store.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringtree native core (C++); use the ringtree package, not this module";
  m.attr("__version__") = RINGTREE_VERSION_STRING;
  ringtree::python::initErrors(m);
  ringtree::python::initStore(m);
  ringtree::python::initCollectives(m);
  ringtree::python::initDiagnostics(m);
  ringtree::python::initPointToPoint(m);
}
