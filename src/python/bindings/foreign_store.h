#pragma once

#include <pybind11/pybind11.h>

namespace ringtree::python {

// Binds ForeignStore(store): a ringtree Store over any Python object with
// torch.distributed.Store's methods (a torch TCPStore, FileStore, HashStore, PrefixStore,
// torchrun's agent store), so that the native core can rendezvous through the store torch
// hands a backend.
void initForeignStore(pybind11::module_& m);

}  // namespace ringtree::python
