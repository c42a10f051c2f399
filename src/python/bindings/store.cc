#include "store.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/store/file_store.h>
#include <ringtree/store/hash_store.h>
#include <ringtree/store/prefix_store.h>
#include <ringtree/store/store.h>
#include <ringtree/store/tcp_store.h>

namespace py = pybind11;

namespace ringtree::python {

namespace {

using Milliseconds = std::chrono::milliseconds;

// Values arrive as str or bytes (pybind11 converts both to std::string while the GIL is
// held) and leave as bytes, as in torch.distributed.
Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

py::bytes toPyBytes(const Bytes& b) { return py::bytes(reinterpret_cast<const char*>(b.data()), b.size()); }

std::vector<Bytes> toBytesList(const std::vector<std::string>& values) {
  std::vector<Bytes> out;
  out.reserve(values.size());
  for (const auto& v : values) {
    out.push_back(toBytes(v));
  }
  return out;
}

}  // namespace

// Constructors that block (connecting, waiting for workers) release the GIL inside their
// factory, never through py::call_guard: a guard would also cover pybind11's registration
// of the new Python instance, which must hold the GIL (concurrent constructions in several
// threads would race on pybind11's instance table).
void initStore(py::module_& m) {
  py::class_<Store, std::shared_ptr<Store>>(m, "Store", R"(Key-value store used for rendezvous.

Mirrors torch.distributed.Store: get() and wait() block until the keys exist or the
timeout passes (then raise DistStoreError naming the keys and the timeout).)")
      .def("set",
           [](Store& s, const std::string& key, const std::string& value) {
             Bytes bytes = toBytes(value);
             py::gil_scoped_release release;
             s.set(key, bytes);
           },
           py::arg("key"), py::arg("value"), "Sets key to value (str or bytes).")
      .def("get",
           [](Store& s, const std::string& key) {
             Bytes value;
             {
               py::gil_scoped_release release;
               value = s.get(key);
             }
             return toPyBytes(value);
           },
           py::arg("key"), "Returns key's value as bytes, waiting up to the store timeout.")
      .def("add", &Store::add, py::arg("key"), py::arg("amount"), py::call_guard<py::gil_scoped_release>(),
           "Adds amount to the integer at key (missing counts as 0); returns the new value.")
      .def("compare_set",
           [](Store& s, const std::string& key, const std::string& expected, const std::string& desired) {
             Bytes e = toBytes(expected);
             Bytes d = toBytes(desired);
             Bytes result;
             {
               py::gil_scoped_release release;
               result = s.compareSet(key, e, d);
             }
             return toPyBytes(result);
           },
           py::arg("key"), py::arg("expected_value"), py::arg("desired_value"),
           "Sets key to desired_value if it holds expected_value; returns the value stored afterwards.")
      .def("check", &Store::check, py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
           "True if every key exists now (never blocks).")
      .def("wait", py::overload_cast<const std::vector<std::string>&>(&Store::wait), py::arg("keys"),
           py::call_guard<py::gil_scoped_release>(), "Waits until every key exists, up to the store timeout.")
      .def("wait", py::overload_cast<const std::vector<std::string>&, Milliseconds>(&Store::wait),
           py::arg("keys"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Waits until every key exists, up to timeout (timedelta).")
      .def(
          "barrier",
          [](Store& s, const std::string& key, int64_t worldSize, std::optional<Milliseconds> timeout) {
            py::gil_scoped_release release;
            s.barrier(key, worldSize, timeout.value_or(s.timeout()));
          },
          py::arg("key"), py::arg("world_size"), py::arg("timeout") = py::none(),
          "Blocks until world_size callers have called barrier with key, up to timeout (default: the store's).")
      .def("delete_key", &Store::deleteKey, py::arg("key"), py::call_guard<py::gil_scoped_release>(),
           "Removes key; returns whether it existed.")
      .def("num_keys", &Store::numKeys, py::call_guard<py::gil_scoped_release>())
      .def("append",
           [](Store& s, const std::string& key, const std::string& value) {
             Bytes bytes = toBytes(value);
             py::gil_scoped_release release;
             s.append(key, bytes);
           },
           py::arg("key"), py::arg("value"), "Appends value to key's value, creating it if missing.")
      .def("multi_get",
           [](Store& s, const std::vector<std::string>& keys) {
             std::vector<Bytes> values;
             {
               py::gil_scoped_release release;
               values = s.multiGet(keys);
             }
             py::list out;
             for (const auto& v : values) {
               out.append(toPyBytes(v));
             }
             return out;
           },
           py::arg("keys"))
      .def("multi_set",
           [](Store& s, const std::vector<std::string>& keys, const std::vector<std::string>& values) {
             std::vector<Bytes> bytes = toBytesList(values);
             py::gil_scoped_release release;
             s.multiSet(keys, bytes);
           },
           py::arg("keys"), py::arg("values"))
      .def("clone", &Store::clone, py::call_guard<py::gil_scoped_release>(),
           "A new client of the same keys that another thread may use concurrently (TCPStore: its own "
           "connection); starts with this store's timeout.")
      .def("set_timeout", &Store::setTimeout, py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("timeout", &Store::timeout, "The default timeout of get() and wait().");

  py::class_<HashStore, Store, std::shared_ptr<HashStore>>(m, "HashStore", "An in-process store.")
      .def(py::init<>());

  py::class_<FileStore, Store, std::shared_ptr<FileStore>>(m, "FileStore", R"(A store in one file.

With world_size > 0 the last of world_size FileStore objects to be destroyed removes the file.)")
      .def(py::init([](const std::string& fileName, int worldSize) {
             py::gil_scoped_release release;
             return std::make_shared<FileStore>(fileName, worldSize);
           }),
           py::arg("file_name"), py::arg("world_size") = -1)
      .def_property_readonly("path", &FileStore::path);

  py::class_<TcpStore, Store, std::shared_ptr<TcpStore>>(m, "TCPStore", R"(A store served over TCP.

With is_master=True this process also runs the server (on a background thread). port=0
with is_master=True lets the kernel pick a free port; read it back from .port. token (or
RINGTREE_STORE_TOKEN) is a shared secret the server requires of every client. The server
also serves torch's own TCPStore client (torch.distributed.TCPStore, is_master=False) when
it has no token: torch's client cannot present one. multi_tenant and use_libuv are accepted for torch compatibility and have no effect.)")
      .def(py::init([](const std::string& hostName, int port, std::optional<int> worldSize, bool isMaster,
                       Milliseconds timeout, bool waitForWorkers, bool /*multiTenant*/,
                       std::optional<int> masterListenFd, bool /*useLibuv*/, std::optional<std::string> token) {
             if (port < 0 || port > 65535) {
               throw InvalidArgument("TCPStore port must be in [0, 65535], got " + std::to_string(port));
             }
             if (!isMaster && port == 0) {
               throw InvalidArgument("TCPStore client needs the server's port; port 0 is only valid with is_master=True");
             }
             if (masterListenFd.has_value()) {
               throw InvalidArgument("TCPStore: master_listen_fd is not supported; use port=0 and read .port");
             }
             TcpStoreOptions options;
             options.port = static_cast<uint16_t>(port);
             options.isServer = isMaster;
             options.numWorkers = worldSize.value_or(-1);
             options.waitForWorkers = waitForWorkers;
             options.token = token.value_or("");
             py::gil_scoped_release release;
             return std::make_shared<TcpStore>(hostName, options, timeout);
           }),
           py::arg("host_name"), py::arg("port"), py::arg("world_size") = py::none(), py::arg("is_master") = false,
           py::arg("timeout") = Milliseconds(Store::kDefaultTimeout), py::arg("wait_for_workers") = true,
           py::arg("multi_tenant") = false, py::arg("master_listen_fd") = py::none(), py::arg("use_libuv") = true,
           py::kw_only(), py::arg("token") = py::none())
      .def_property_readonly("host", &TcpStore::host)
      .def_property_readonly("port", &TcpStore::port)
      .def_property_readonly("_num_server_clients", &TcpStore::numServerClients,
                             "Live client connections of the server this object runs; -1 if it runs none.")
      .def_property_readonly("_total_server_clients", &TcpStore::totalServerClients,
                             "Client connections the server this object runs has accepted since it started "
                             "(closed ones included); -1 if it runs none.");

  py::class_<PrefixStore, Store, std::shared_ptr<PrefixStore>>(m, "PrefixStore",
                                                              "A view of a store with every key prefixed.")
      .def(py::init([](const std::string& prefix, std::shared_ptr<Store> store) {
             if (!store) {
               throw InvalidArgument("PrefixStore needs a store, got None");
             }
             return std::make_shared<PrefixStore>(prefix, std::move(store));
           }),
           py::arg("prefix"), py::arg("store"))
      .def_property_readonly("underlying_store", &PrefixStore::underlyingStore)
      .def_property_readonly("prefix", &PrefixStore::prefix);
}

}  // namespace ringtree::python
