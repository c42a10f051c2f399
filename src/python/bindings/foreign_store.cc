#include "foreign_store.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ringtree/error.h>
#include <ringtree/store/store.h>

#include "buffers.h"
#include "gil_until_wait.h"

namespace py = pybind11;

namespace ringtree::python {

namespace {

using Milliseconds = std::chrono::milliseconds;

py::bytes toPyBytes(const Bytes& b) { return py::bytes(reinterpret_cast<const char*>(b.data()), b.size()); }

Bytes fromPyBytes(const py::handle& value) {
  const std::string text = py::cast<std::string>(value);
  return Bytes(text.begin(), text.end());
}

// The Store interface over a Python object with torch.distributed.Store's methods. Every
// call takes the GIL (the core calls from threads that do not hold it), and fails with
// StoreError instead once the interpreter is finalizing. The object's errors become
// ringtree errors carrying their text: a network error (a DistNetworkError, a
// ConnectionError) becomes NetworkError, anything else StoreError. Timeouts are this
// object's own (get() waits with it, then reads): never set on the Python store, whose
// clone() may be the very same object (torch's HashStore).
class ForeignStore final : public Store {
 public:
  explicit ForeignStore(py::object store)
      : Store(std::chrono::duration_cast<Milliseconds>(py::cast<std::chrono::microseconds>(store.attr("timeout")))),
        store_(std::move(store)),
        description_(py::str(py::type::handle_of(store_).attr("__name__"))) {}

  ~ForeignStore() override {
    if (pythonIsFinalizing()) {
      store_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    const PythonRunsHere python;
    store_ = py::object();
  }

  void set(const std::string& key, const Bytes& value) override {
    call("set", [&] { store_.attr("set")(key, toPyBytes(value)); });
  }

  Bytes get(const std::string& key) override {
    wait({key}, timeout());
    Bytes out;
    call("get", [&] { out = fromPyBytes(store_.attr("get")(key)); });
    return out;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t out = 0;
    call("add", [&] { out = py::cast<int64_t>(store_.attr("add")(key, delta)); });
    return out;
  }

  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Bytes out;
    call("compare_set",
         [&] { out = fromPyBytes(store_.attr("compare_set")(key, toPyBytes(expected), toPyBytes(desired))); });
    return out;
  }

  bool check(const std::vector<std::string>& keys) override {
    bool out = false;
    call("check", [&] { out = py::cast<bool>(store_.attr("check")(keys)); });
    return out;
  }

  void wait(const std::vector<std::string>& keys, Timeout timeout) override {
    if (timeout.count() < 0) {
      throw InvalidArgument("store wait: timeout must not be negative, got " + std::to_string(timeout.count()) + " ms");
    }
    if (timeout.count() == 0) {  // ringtree's "do not wait": check once
      if (!check(keys)) throw StoreError("store wait: keys missing and timeout 0 (" + description_ + ")");
      return;
    }
    call("wait", [&] { store_.attr("wait")(keys, std::chrono::duration_cast<std::chrono::microseconds>(timeout)); });
  }

  bool deleteKey(const std::string& key) override {
    bool out = false;
    call("delete_key", [&] { out = py::cast<bool>(store_.attr("delete_key")(key)); });
    return out;
  }

  int64_t numKeys() override {
    int64_t out = 0;
    call("num_keys", [&] { out = py::cast<int64_t>(store_.attr("num_keys")()); });
    return out;
  }

  void append(const std::string& key, const Bytes& value) override {
    call("append", [&] { store_.attr("append")(key, toPyBytes(value)); });
  }

  std::vector<Bytes> multiGet(const std::vector<std::string>& keys) override {
    wait(keys, timeout());
    std::vector<Bytes> out;
    call("multi_get", [&] {
      for (const py::handle value : store_.attr("multi_get")(keys)) out.push_back(fromPyBytes(value));
    });
    return out;
  }

  std::shared_ptr<Store> clone() override {
    std::shared_ptr<Store> out;
    call("clone", [&] { out = std::make_shared<ForeignStore>(store_.attr("clone")()); });
    return out;
  }

 private:
  // Runs body with the GIL, turning a Python error into a ringtree one.
  template <typename Body>
  void call(const char* method, Body&& body) {
    if (pythonIsFinalizing()) {
      throw StoreError(description_ + "." + method + ": the Python interpreter is shutting down");
    }
    py::gil_scoped_acquire gil;
    const PythonRunsHere python;
    try {
      body();
    } catch (py::error_already_set& error) {
      const std::string text = description_ + "." + method + ": " + error.what();
      const std::string type = py::str(error.type().attr("__name__"));
      if (error.matches(PyExc_ConnectionError) || type.find("NetworkError") != std::string::npos) {
        throw NetworkError(text);
      }
      throw StoreError(text);
    } catch (const py::cast_error& error) {  // a value of the wrong type
      throw StoreError(description_ + "." + method + ": unexpected result: " + error.what());
    }
  }

  py::object store_;
  std::string description_;
};

}  // namespace

void initForeignStore(py::module_& m) {
  m.def(
      "ForeignStore",
      [](py::object store) -> std::shared_ptr<Store> {
        if (store.is_none()) throw InvalidArgument("ForeignStore needs a store, got None");
        return std::make_shared<ForeignStore>(std::move(store));
      },
      py::arg("store"),
      "A ringtree Store over an object with torch.distributed.Store's methods (a torch store), for the native "
      "core's rendezvous; every call takes the GIL.");
}

}  // namespace ringtree::python
