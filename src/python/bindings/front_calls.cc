#include "front_calls.h"

#include <structmember.h>

#include <array>
#include <cstddef>
#include <string>

#include "engine_calls.h"

namespace py = pybind11;

// ringtree._C.FrontCall(function, world, group_type): the module-level calls of the Python
// front that small-message latency rides on (all_reduce, broadcast, reduce,
// all_gather_single, reduce_scatter_single, all_to_all_single, barrier, send, recv, isend,
// irecv) as C callables. Each wraps its Python function and runs that function's common
// branch itself: no group argument (nor group_src/group_dst, nor barrier's timeout), a
// default group, a rank its map knows; it reads the group's fields at their __slots__
// offsets and calls the engine's vectorcall method directly (engine_calls.h). Every other
// call (another group, a group rank, an unknown keyword, no default group, a rank the map
// does not know) goes to the Python function with the same arguments. The Python
// function's common branch does exactly what this one does (the same rank lookup, whose
// exception, if any, is raised from here; the function's defaults as they are at the
// call), so the behaviour, errors included, is the same either way; this one spares the
// interpreter's frame and the attribute and method lookups (~0.1 us of a 0.4 us one-rank
// call). What it does not see: a patched ProcessGroup.engine/p2p, patched methods of the
// native engine or a replaced `world` in the Python modules (the C entry reads the slots
// and calls the methods' C functions), and tracebacks and profilers show no Python frame.
//
// The wrapper shows the function's __doc__, __name__, __qualname__, __module__,
// __annotations__, __defaults__ and __kwdefaults__, gives it as __wrapped__ (so
// inspect.signature reports the Python signature), binds as a function does when looked
// up on an instance (so inspect and pydoc take it for a routine), takes weak references
// and pickles by reference as the function does.
namespace ringtree::python {

namespace {

// The most parameters a wrapped function has, and the most arguments its engine call takes.
constexpr Py_ssize_t kMaxParams = 8;
constexpr size_t kMaxForwarded = 6;

// Which engine of the group runs the call: ProcessGroup._engine (collectives) or _p2p.
enum class EngineField { kCollectives, kPointToPoint };
// How the rank argument becomes the engine's: ProcessGroup.group_rank_of or peer_rank_of.
enum class RankMap { kNone, kGroupRank, kPeerRank };

// One wrapped function's common branch: with the parameters named in `mustBeNone` None,
// the default group's `engine` runs `method` with the arguments named in `forwarded`,
// `rankParam` replaced by its image in `rankMap` (a rank the map does not know takes the
// Python way). Lists end at the first nullptr.
struct Kind {
  const char* name;
  EngineMethod method;
  EngineField engine;
  std::array<const char*, 3> mustBeNone;
  RankMap rankMap;
  const char* rankParam;
  std::array<const char*, kMaxForwarded> forwarded;
  bool returnsNone;  // the function returns None whatever the engine's method returns
};

constexpr EngineField kColl = EngineField::kCollectives;
constexpr EngineField kP2p = EngineField::kPointToPoint;

const std::array<Kind, 11> kKinds = {{
    {"all_reduce", kAllreduce, kColl, {"group"}, RankMap::kNone, nullptr, {"tensor", "op", "async_op", "algorithm"}, false},
    {"broadcast", kBroadcast, kColl, {"group", "group_src"}, RankMap::kGroupRank, "src",
     {"tensor", "src", "async_op", "algorithm"}, false},
    {"reduce", kReduce, kColl, {"group", "group_dst"}, RankMap::kGroupRank, "dst",
     {"tensor", "dst", "op", "async_op", "algorithm"}, false},
    {"all_gather_single", kAllgatherSingle, kColl, {"group"}, RankMap::kNone, nullptr,
     {"output_tensor", "input_tensor", "async_op", "algorithm"}, false},
    {"reduce_scatter_single", kReduceScatterSingle, kColl, {"group"}, RankMap::kNone, nullptr,
     {"output", "input", "op", "async_op", "algorithm"}, false},
    {"all_to_all_single", kAlltoallSingle, kColl, {"group"}, RankMap::kNone, nullptr,
     {"output", "input", "output_split_sizes", "input_split_sizes", "async_op", "algorithm"}, false},
    {"barrier", kBarrier, kColl, {"group", "timeout"}, RankMap::kNone, nullptr, {"timeout", "async_op"}, false},
    {"send", kSend, kP2p, {"group", "group_dst"}, RankMap::kPeerRank, "dst", {"tensor", "dst", "tag"}, true},
    {"isend", kIsend, kP2p, {"group", "group_dst"}, RankMap::kPeerRank, "dst", {"tensor", "dst", "tag"}, false},
    {"recv", kRecv, kP2p, {"group", "group_src"}, RankMap::kPeerRank, "src", {"tensor", "src", "tag"}, false},
    {"irecv", kIrecv, kP2p, {"group", "group_src"}, RankMap::kPeerRank, "src", {"tensor", "src", "tag"}, false},
}};

// Attributes a FrontCall reads from its function.
// (__doc__ is a getset of the type instead: pydoc reads it past tp_getattro.)
constexpr std::array<const char*, 6> kForwardedAttributes = {
    "__name__", "__qualname__", "__module__", "__annotations__", "__defaults__", "__kwdefaults__"};

struct PyFrontCall {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* function;     // the Python function (the other calls' way)
  PyObject* world;        // the object whose default_pg slot holds the default group
  PyObject* groupType;    // the Python ProcessGroup class
  PyObject* methodName;   // the engine method's name, for engines other than the native one
  PyObject* weakrefs;     // the weak references to the FrontCall
  const Kind* kind;
  // The function's parameters: the positional-or-keyword ones, then the keyword-only ones.
  Py_ssize_t positionalCount;
  Py_ssize_t paramCount;
  std::array<PyObject*, kMaxParams> names;  // interned
  // Indexes into the parameters of the Kind's names (-1 ends a list, rankIndex -1: none).
  std::array<Py_ssize_t, 3> mustBeNone;
  Py_ssize_t rankIndex;
  std::array<Py_ssize_t, kMaxForwarded> forwarded;
  size_t forwardedCount;
  // Byte offsets of __slots__ fields: world.default_pg, group._engine or _p2p, and
  // group.group_rank_of or peer_rank_of.
  Py_ssize_t defaultGroupOffset;
  Py_ssize_t engineOffset;
  Py_ssize_t rankMapOffset;
};

PyFrontCall& asFrontCall(PyObject* object) { return *reinterpret_cast<PyFrontCall*>(object); }

// A new reference to `object` (Py_NewRef, which Python 3.9 lacks).
PyObject* newReference(PyObject* object) {
  Py_INCREF(object);
  return object;
}

// The object in the __slots__ field at `offset` of `object` (borrowed; nullptr when unset).
PyObject* slotValue(PyObject* object, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(object) + offset);
}

// The offset of `type`'s __slots__ field `name`; -1 with an exception set if it is not one.
Py_ssize_t slotOffset(PyObject* type, const char* name) {
  PyObject* descriptor = PyObject_GetAttrString(type, name);
  if (descriptor == nullptr && !PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  Py_ssize_t offset = -1;
  if (descriptor != nullptr && Py_IS_TYPE(descriptor, &PyMemberDescr_Type)) {
    const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descriptor)->d_member;
    if (member->type == T_OBJECT_EX && (member->flags & READONLY) == 0) offset = member->offset;
  }
  Py_XDECREF(descriptor);
  if (offset < 0) PyErr_Format(PyExc_TypeError, "FrontCall: %R has no __slots__ field %s", type, name);
  return offset;
}

// The index of the parameter `name`, -1 if there is none.
Py_ssize_t parameterIndex(const PyFrontCall& self, PyObject* name) {
  for (Py_ssize_t index = 0; index < self.paramCount; ++index) {
    if (self.names[static_cast<size_t>(index)] == name) return index;
  }
  for (Py_ssize_t index = 0; index < self.paramCount; ++index) {
    if (PyUnicode_Compare(self.names[static_cast<size_t>(index)], name) == 0) return index;
  }
  PyErr_Clear();  // a comparison that failed counts as no match
  return -1;
}

Py_ssize_t parameterIndex(const PyFrontCall& self, const char* name) {
  for (Py_ssize_t index = 0; index < self.paramCount; ++index) {
    if (PyUnicode_CompareWithASCIIString(self.names[static_cast<size_t>(index)], name) == 0) return index;
  }
  return -1;
}

// Binds a call's arguments to the parameters as the function would, its defaults read
// from it now (borrowed references); false for a call it would refuse (too many
// positional arguments, an unknown or repeated keyword, a required parameter missing).
bool bindArguments(const PyFrontCall& self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                   PyObject** bound) {
  if (nargs > self.positionalCount) return false;
  for (Py_ssize_t index = 0; index < self.paramCount; ++index) bound[index] = index < nargs ? args[index] : nullptr;
  if (kwnames != nullptr) {
    const Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < count; ++k) {
      const Py_ssize_t index = parameterIndex(self, PyTuple_GET_ITEM(kwnames, k));
      if (index < 0 || bound[index] != nullptr) return false;
      bound[index] = args[nargs + k];
    }
  }
  PyObject* positionalDefaults = PyFunction_GET_DEFAULTS(self.function);
  const Py_ssize_t defaultCount = positionalDefaults == nullptr ? 0 : PyTuple_GET_SIZE(positionalDefaults);
  PyObject* keywordDefaults = PyFunction_GET_KW_DEFAULTS(self.function);
  for (Py_ssize_t index = 0; index < self.paramCount; ++index) {
    if (bound[index] != nullptr) continue;
    if (index < self.positionalCount) {
      const Py_ssize_t fromEnd = self.positionalCount - index;
      if (fromEnd > defaultCount) return false;
      bound[index] = PyTuple_GET_ITEM(positionalDefaults, defaultCount - fromEnd);
    } else {
      if (keywordDefaults == nullptr) return false;
      bound[index] = PyDict_GetItemWithError(keywordDefaults, self.names[static_cast<size_t>(index)]);
      if (bound[index] == nullptr) {
        PyErr_Clear();
        return false;
      }
    }
  }
  return true;
}

// The definition of dict.get (set by initFrontCalls): a rank map is a dict's get.
const PyMethodDef* dictGet = nullptr;

// The image of `rank` in the group's rank map, a bound dict.get, as map(rank) gives it:
// a new reference, Py_None for a rank the map does not know, nullptr with the exception
// the lookup raised (a rank's __hash__ or __eq__: the Python way raises it too, from the
// same lookup). nullptr without an exception for a map of another kind. The map is held
// while the lookup runs Python code that may rebind it.
PyObject* mappedRank(PyObject* map, PyObject* rank) {
  if (map == nullptr || !PyCFunction_Check(map) || reinterpret_cast<PyCFunctionObject*>(map)->m_ml != dictGet) {
    return nullptr;
  }
  PyObject* dict = PyCFunction_GET_SELF(map);
  if (dict == nullptr || !PyDict_CheckExact(dict)) return nullptr;
  const py::object held = py::reinterpret_borrow<py::object>(map);
  PyObject* image = PyDict_GetItemWithError(dict, rank);
  if (image == nullptr) return PyErr_Occurred() != nullptr ? nullptr : newReference(Py_None);
  return newReference(image);
}

// Runs the common branch into *result (which may be nullptr with an exception set: the
// engine's call failed); false leaves the call to the Python function.
bool runCommonCall(PyFrontCall& self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** result) {
  std::array<PyObject*, kMaxParams> bound{};
  if (!bindArguments(self, args, nargs, kwnames, bound.data())) return false;
  for (const Py_ssize_t index : self.mustBeNone) {
    if (index < 0) break;
    if (bound[static_cast<size_t>(index)] != Py_None) return false;
  }
  PyObject* group = slotValue(self.world, self.defaultGroupOffset);
  if (group == nullptr || Py_TYPE(group) != reinterpret_cast<PyTypeObject*>(self.groupType)) return false;
  // Strong references for the call: a blocking call lets other threads run, one of which
  // may destroy the group meanwhile.
  py::object groupRef = py::reinterpret_borrow<py::object>(group);
  py::object rank;
  if (self.rankIndex >= 0) {
    rank = py::reinterpret_steal<py::object>(
        mappedRank(slotValue(group, self.rankMapOffset), bound[static_cast<size_t>(self.rankIndex)]));
    if (!rank) {
      if (PyErr_Occurred() == nullptr) return false;
      *result = nullptr;  // the lookup's exception, as the Python way raises it
      return true;
    }
    if (rank.is_none()) return false;  // a rank the group's map does not know: the Python way refuses it
  }
  PyObject* engine = slotValue(group, self.engineOffset);
  if (engine == nullptr) return false;
  py::object engineRef = py::reinterpret_borrow<py::object>(engine);
  // The engine's arguments, after a free first place for a method call's self.
  std::array<PyObject*, kMaxForwarded + 1> call{};
  for (size_t k = 0; k < self.forwardedCount; ++k) {
    const Py_ssize_t index = self.forwarded[k];
    call[k + 1] = index == self.rankIndex ? rank.ptr() : bound[static_cast<size_t>(index)];
  }
  const auto count = static_cast<Py_ssize_t>(self.forwardedCount);
  PyObject* output = nullptr;
  if (Py_TYPE(engine) == engineType()) {
    output = callEngineMethod(self.kind->method, engine, call.data() + 1, count);
  } else {  // a CUDA-only, MPI or absent engine: its method, as the Python way calls it
    call[0] = engine;
    output = PyObject_VectorcallMethod(self.methodName, call.data(), static_cast<size_t>(count) + 1, nullptr);
  }
  if (output != nullptr && self.kind->returnsNone) {
    Py_DECREF(output);
    output = newReference(Py_None);
  }
  *result = output;
  return true;
}

// The function a FrontCall wraps; nullptr with RuntimeError once the collector cleared it.
PyObject* wrappedFunction(PyFrontCall& self) {
  if (self.function == nullptr) PyErr_SetString(PyExc_RuntimeError, "FrontCall: cleared by the garbage collector");
  return self.function;
}

PyObject* vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyFrontCall& self = asFrontCall(callable);
  if (wrappedFunction(self) == nullptr) return nullptr;
  PyObject* result = nullptr;
  if (runCommonCall(self, args, PyVectorcall_NARGS(nargsf), kwnames, &result)) return result;
  return PyObject_Vectorcall(self.function, args, nargsf, kwnames);
}

// Fills the parameters, the Kind's indexes and the slot offsets from the arguments of the
// constructor; false with an exception set.
bool describe(PyFrontCall& self, PyObject* function, PyObject* world, PyObject* groupType) {
  py::object name = py::reinterpret_steal<py::object>(PyObject_GetAttrString(function, "__name__"));
  if (!name) return false;
  for (const Kind& kind : kKinds) {
    if (PyUnicode_CompareWithASCIIString(name.ptr(), kind.name) == 0) self.kind = &kind;
  }
  if (self.kind == nullptr) {
    PyErr_Format(PyExc_ValueError, "FrontCall: no C entry for %R", name.ptr());
    return false;
  }
  try {
    py::handle fn(function);
    py::object code = fn.attr("__code__");
    const auto flags = code.attr("co_flags").cast<long>();
    if ((flags & (CO_VARARGS | CO_VARKEYWORDS)) != 0 || code.attr("co_posonlyargcount").cast<Py_ssize_t>() != 0) {
      throw py::value_error("FrontCall: the function takes *args, **kwargs or positional-only parameters");
    }
    self.positionalCount = code.attr("co_argcount").cast<Py_ssize_t>();
    self.paramCount = self.positionalCount + code.attr("co_kwonlyargcount").cast<Py_ssize_t>();
    if (self.paramCount > kMaxParams) throw py::value_error("FrontCall: too many parameters");
    py::tuple varnames = code.attr("co_varnames");
    for (Py_ssize_t index = 0; index < self.paramCount; ++index) {
      PyObject* parameter = varnames[static_cast<size_t>(index)].ptr();
      Py_INCREF(parameter);
      PyUnicode_InternInPlace(&parameter);
      self.names[static_cast<size_t>(index)] = parameter;
    }
    const auto required = [&self](const char* parameter) {
      const Py_ssize_t index = parameterIndex(self, parameter);
      if (index < 0) throw py::value_error(std::string("FrontCall: the function has no parameter ") + parameter);
      return index;
    };
    self.mustBeNone.fill(-1);
    for (size_t k = 0; k < self.kind->mustBeNone.size() && self.kind->mustBeNone[k] != nullptr; ++k) {
      self.mustBeNone[k] = required(self.kind->mustBeNone[k]);
    }
    self.rankIndex = self.kind->rankParam == nullptr ? -1 : required(self.kind->rankParam);
    for (const char* parameter : self.kind->forwarded) {
      if (parameter == nullptr) break;
      self.forwarded[self.forwardedCount++] = required(parameter);
    }
  } catch (py::error_already_set& error) {
    error.restore();
    return false;
  } catch (py::builtin_exception& error) {
    error.set_error();
    return false;
  }
  if (!PyType_Check(groupType)) {
    PyErr_SetString(PyExc_TypeError, "FrontCall: group_type must be a class");
    return false;
  }
  self.defaultGroupOffset = slotOffset(reinterpret_cast<PyObject*>(Py_TYPE(world)), "default_pg");
  if (self.defaultGroupOffset < 0) return false;
  const bool p2p = self.kind->engine == EngineField::kPointToPoint;
  self.engineOffset = slotOffset(groupType, p2p ? "_p2p" : "_engine");
  if (self.engineOffset < 0) return false;
  if (self.kind->rankMap != RankMap::kNone) {
    self.rankMapOffset = slotOffset(groupType, self.kind->rankMap == RankMap::kGroupRank ? "group_rank_of" : "peer_rank_of");
    if (self.rankMapOffset < 0) return false;
  }
  self.methodName = PyUnicode_InternFromString(engineMethodName(self.kind->method));
  if (self.methodName == nullptr) return false;
  self.function = newReference(function);
  self.world = newReference(world);
  self.groupType = newReference(groupType);
  return true;
}

int clear(PyObject* object) {
  PyFrontCall& self = asFrontCall(object);
  Py_CLEAR(self.function);
  Py_CLEAR(self.world);
  Py_CLEAR(self.groupType);
  Py_CLEAR(self.methodName);
  for (auto& name : self.names) Py_CLEAR(name);
  return 0;
}

int traverse(PyObject* object, visitproc visit, void* arg) {
  PyFrontCall& self = asFrontCall(object);
  Py_VISIT(Py_TYPE(object));
  Py_VISIT(self.function);
  Py_VISIT(self.world);
  Py_VISIT(self.groupType);
  return 0;
}

void dealloc(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  PyObject_GC_UnTrack(object);
  if (asFrontCall(object).weakrefs != nullptr) PyObject_ClearWeakRefs(object);
  clear(object);
  type->tp_free(object);
  Py_DECREF(type);
}

PyObject* create(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* function = nullptr;
  PyObject* world = nullptr;
  PyObject* groupType = nullptr;
  static const char* keywords[] = {"function", "world", "group_type", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:FrontCall", const_cast<char**>(keywords), &function, &world,
                                   &groupType)) {
    return nullptr;
  }
  if (!PyFunction_Check(function)) {
    PyErr_SetString(PyExc_TypeError, "FrontCall: function must be a Python function");
    return nullptr;
  }
  PyObject* object = type->tp_alloc(type, 0);
  if (object == nullptr) return nullptr;
  PyFrontCall& self = asFrontCall(object);
  self.vectorcall = &vectorcall;
  if (!describe(self, function, world, groupType)) {
    Py_DECREF(object);
    return nullptr;
  }
  return object;
}

PyObject* getattro(PyObject* object, PyObject* name) {
  PyFrontCall& self = asFrontCall(object);
  if (PyUnicode_Check(name) && self.function != nullptr) {
    if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0) return newReference(self.function);
    for (const char* forwarded : kForwardedAttributes) {
      if (PyUnicode_CompareWithASCIIString(name, forwarded) == 0) return PyObject_GetAttr(self.function, name);
    }
  }
  return PyObject_GenericGetAttr(object, name);
}

PyObject* repr(PyObject* object) {
  PyObject* function = wrappedFunction(asFrontCall(object));
  return function == nullptr ? nullptr : PyObject_Repr(function);
}

// Pickled by reference, as a module-level function is: pickle looks the name up in
// __module__.
PyObject* reduce(PyObject* object, PyObject*) {
  PyObject* function = wrappedFunction(asFrontCall(object));
  return function == nullptr ? nullptr : PyObject_GetAttrString(function, "__qualname__");
}

// As a function's __get__: a method bound to `instance` when looked up on one, the object
// itself otherwise (so inspect and pydoc see a routine, and a class attribute binds).
PyObject* descriptorGet(PyObject* object, PyObject* instance, PyObject*) {
  if (instance == nullptr || instance == Py_None) return newReference(object);
  return PyMethod_New(object, instance);
}

PyObject* getDoc(PyObject* object, void*) {
  PyObject* function = wrappedFunction(asFrontCall(object));
  return function == nullptr ? nullptr : PyObject_GetAttrString(function, "__doc__");
}

// No Py_tp_doc: the type's docstring would take the place of this getset in its dict.
PyGetSetDef getsets[] = {
    {"__doc__", &getDoc, nullptr, "The wrapped function's docstring.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyMethodDef methods[] = {
    {"__reduce__", &reduce, METH_NOARGS, "Pickled by reference (the module-level name)."},
    {nullptr, nullptr, 0, nullptr},
};

PyMemberDef members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(PyFrontCall, vectorcall), READONLY, nullptr},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PyFrontCall, weakrefs), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr},
};

PyType_Slot slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(&create)},
    {Py_tp_dealloc, reinterpret_cast<void*>(&dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(&traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(&clear)},
    {Py_tp_call, reinterpret_cast<void*>(&PyVectorcall_Call)},
    {Py_tp_getattro, reinterpret_cast<void*>(&getattro)},
    {Py_tp_repr, reinterpret_cast<void*>(&repr)},
    {Py_tp_descr_get, reinterpret_cast<void*>(&descriptorGet)},
    {Py_tp_methods, methods},
    {Py_tp_members, members},
    {Py_tp_getset, getsets},
    {0, nullptr},
};

PyType_Spec spec = {"ringtree._C.FrontCall", sizeof(PyFrontCall), 0,
                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, slots};

}  // namespace

void initFrontCalls(py::module_& m) {
  py::object get = py::dict().attr("get");
  dictGet = reinterpret_cast<PyCFunctionObject*>(get.ptr())->m_ml;
  PyObject* type = PyType_FromSpec(&spec);
  if (type == nullptr) throw py::error_already_set();
  m.add_object("FrontCall", py::reinterpret_steal<py::object>(type));
}

}  // namespace ringtree::python
