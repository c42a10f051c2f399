#pragma once

#include <cstddef>
#include <string>

// NCCL's C interface as ringtree calls it: the types and values of nccl.h that ringtree
// uses (NCCL's ABI, stable across 2.x) and a table of the functions, filled from the
// library nccl_loader.h opens at run time. ringtree never includes nccl.h nor links NCCL.
namespace ringtree::cuda {

// ncclComm_t.
using NcclComm = void*;
// ncclUniqueId: 128 opaque bytes, passed by value.
struct NcclUniqueId {
  char internal[128];
};

// ncclResult_t.
enum NcclResult : int {
  kNcclSuccess = 0,
  kNcclUnhandledCudaError = 1,
  kNcclSystemError = 2,
  kNcclInternalError = 3,
  kNcclInvalidArgument = 4,
  kNcclInvalidUsage = 5,
  kNcclRemoteError = 6,
  kNcclInProgress = 7,
};

// ncclDataType_t.
enum NcclDataType : int {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclUint32 = 3,
  kNcclInt64 = 4,
  kNcclUint64 = 5,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclFloat64 = 8,
  kNcclBfloat16 = 9,
};

// ncclRedOp_t's built-in values (ncclRedOpCreatePreMulSum makes others).
enum NcclRedOp : int {
  kNcclSum = 0,
  kNcclProd = 1,
  kNcclMax = 2,
  kNcclMin = 3,
  kNcclAvg = 4,
};

// ncclScalarResidence_t.
enum NcclScalarResidence : int {
  kNcclScalarDevice = 0,
  kNcclScalarHostImmediate = 1,
};

// The NCCL functions ringtree calls. Streams are cudaStream_t as void*. Members marked
// "optional" are null when the loaded NCCL predates them; the others are always set.
struct NcclApi {
  std::string path;  // the library file they came from (for messages)
  int version = 0;   // ncclGetVersion's code: 22807 = 2.28.7

  int (*getVersion)(int* version) = nullptr;
  const char* (*getErrorString)(int result) = nullptr;
  const char* (*getLastError)(NcclComm comm) = nullptr;  // optional (2.13)
  int (*getUniqueId)(NcclUniqueId* id) = nullptr;
  int (*commInitRank)(NcclComm* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  // config: ncclConfig_t*, always null here (the default configuration).
  int (*commSplit)(NcclComm comm, int color, int key, NcclComm* newComm, void* config) = nullptr;  // optional (2.18)
  int (*commDestroy)(NcclComm comm) = nullptr;
  int (*commAbort)(NcclComm comm) = nullptr;
  int (*commGetAsyncError)(NcclComm comm, int* asyncError) = nullptr;

  int (*allReduce)(const void* send, void* recv, size_t count, int type, int op, NcclComm comm, void* stream) = nullptr;
  int (*broadcast)(const void* send, void* recv, size_t count, int type, int root, NcclComm comm,
                   void* stream) = nullptr;
  int (*reduce)(const void* send, void* recv, size_t count, int type, int op, int root, NcclComm comm,
                void* stream) = nullptr;
  int (*allGather)(const void* send, void* recv, size_t sendCount, int type, NcclComm comm, void* stream) = nullptr;
  int (*reduceScatter)(const void* send, void* recv, size_t recvCount, int type, int op, NcclComm comm,
                       void* stream) = nullptr;
  int (*send)(const void* send, size_t count, int type, int peer, NcclComm comm, void* stream) = nullptr;
  int (*recv)(void* recv, size_t count, int type, int peer, NcclComm comm, void* stream) = nullptr;
  int (*groupStart)() = nullptr;
  int (*groupEnd)() = nullptr;
  int (*redOpCreatePreMulSum)(int* op, void* scalar, int type, int residence, NcclComm comm) = nullptr;  // optional (2.11)
  int (*redOpDestroy)(int op, NcclComm comm) = nullptr;  // optional (2.11)
};

// "2.28.7" from a version code (22807; codes before 2.9 were 2708 = 2.7.8).
std::string ncclVersionString(int code);

}  // namespace ringtree::cuda
