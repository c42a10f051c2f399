#include "diagnostics.h"

#include <string>

#include <ringtree/communicator.h>

namespace py = pybind11;

namespace ringtree::python {

void initDiagnostics(py::module_& m) {
  m.def(
      "_flight_record_json",
      [](const Communicator& communicator, const std::string& reason) {
        return communicator.flightRecordJson(reason);
      },
      py::arg("communicator"), py::arg("reason"),
      "The communicator's flight record as a JSON document (see <ringtree/flight_recorder.h>).");
  m.def(
      "_dump_flight_record",
      [](const Communicator& communicator, const std::string& reason) {
        return communicator.dumpFlightRecord(reason);
      },
      py::arg("communicator"), py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
      "Writes the flight record into RINGTREE_FLIGHT_RECORDER_DIR when it is set; returns the file's path, "
      "or '' when it is not set.");
  m.def(
      "_set_identity",
      [](Communicator& communicator, const std::string& groupName, int globalRank, bool world) {
        communicator.setIdentity(CommunicatorIdentity{groupName, globalRank, world});
      },
      py::arg("communicator"), py::arg("group_name"), py::arg("global_rank"), py::arg("world"),
      "Names the communicator in flight-record dumps (call before its first collective).");
}

}  // namespace ringtree::python
