#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds Store, HashStore, FileStore, TCPStore and PrefixStore with torch.distributed's
// Python names and signatures. Every blocking call releases the GIL.
void initStore(pybind11::module_& m);

}  // namespace ringtree::python
