#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

// Every RINGTREE_* environment variable the C++ core reads is declared here, once, with
// its default and meaning. Values are read when asked for (not cached), so tests can set
// them per case.
namespace ringtree::env {

// RINGTREE_STORE_TOKEN: shared secret for TcpStore (client and server). Default: none.
std::string storeToken();

// RINGTREE_LOG_LEVEL: error|warn|info|debug. Default: warn.
std::string logLevel();

// RINGTREE_ALGO: algorithm every collective uses instead of the automatic choice, when
// the collective implements it (ring|tree|halving_doubling|chain|shm_direct). Default: none.
// Read when a communicator is created (readAlgorithm), not at every call: algorithm()
// returns the value the latest creation read (read now if none was), without a lock or
// an allocation. Thread-safe; the strings returned stay valid for the process's life.
void readAlgorithm();
const std::string& algorithm();

// RINGTREE_TRANSPORT: auto|tcp|shm, how a communicator reaches its peers (see
// CommunicatorOptions::transport, which it replaces when set). Default: unset (empty).
std::string transport();

// RINGTREE_SHM_ARENA: 0 keeps a communicator from creating the node-wide shared-memory
// segment (arena/node_arena.h) that the shm_direct collectives need, 1 (or unset)
// lets it create one when all its ranks reach each other over shared memory. Any rank
// that disables it disables it for the whole communicator. Default: unset (empty).
std::string shmArena();

// RINGTREE_CONNECT: auto|eager|lazy, when a communicator connects to its peers: all at
// creation (eager), each when first needed (lazy), eager up to 16 ranks and lazy above
// (auto). Default: unset (empty, auto).
std::string connectMode();

// RINGTREE_SOCKET_IFNAME: network interface whose address TCP connections between ranks
// use (e.g. "eth0"), when CommunicatorOptions::interface is empty. Default: unset (empty).
std::string socketIfname();

// RINGTREE_FLIGHT_RECORDER_ENTRIES: how many of its latest collective calls each
// communicator's flight recorder keeps (<ringtree/flight_recorder.h>). Values below 2
// count as 2. Default: 2048. Throws InvalidArgument for a value that is not a
// non-negative integer.
size_t flightRecorderEntries();

// RINGTREE_FLIGHT_RECORDER_DIR: directory into which each rank writes its flight record
// as JSON when one of its collectives fails (timeout, network error, mismatch) and when
// its group is destroyed or aborted (Communicator::dumpFlightRecord). Default: unset
// (empty: no files).
std::string flightRecorderDir();

// RINGTREE_NCCL_PATH: the NCCL library file, or a folder holding libnccl.so.2, where
// the CUDA backend looks after a libnccl already loaded and the nvidia-nccl wheels
// (backends/cuda/nccl_loader.h). Default: unset (empty).
std::string ncclPath();

// RINGTREE_CUDA_LIBRARY: ringtree's CUDA library file (libringtree_cuda.so), looked at
// before the one beside the core (backends/cuda/gpu_runtime.h). Default: unset (empty).
std::string cudaLibrary();

// RINGTREE_CUDA_BACKEND: auto|nccl|staged, what serves a group's CUDA buffers
// (backends/cuda/backend_choice.h): auto takes NCCL unless two ranks share a GPU or one
// has no usable NCCL. Default: unset (empty, as auto).
std::string cudaBackend();

// Reads an environment variable; returns fallback when it is unset.
std::string getString(const char* name, const std::string& fallback = "");

}  // namespace ringtree::env
