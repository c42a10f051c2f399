// A stand-in for libnccl.so.2 in the loader tests: the C functions ringtree looks up, with
// NCCL's signatures, doing nothing and returning success. Compile definitions pick the
// variant:
//   FAKE_NCCL_VERSION=<code>  what ncclGetVersion reports (default 22807, NCCL 2.28.7)
//   FAKE_NCCL_OPTIONAL=0      leaves out the optional functions (ncclGetLastError,
//                             ncclCommSplit, ncclRedOpCreatePreMulSum, ncclRedOpDestroy)
//   FAKE_NCCL_INIT_RANK=0     leaves out ncclCommInitRank

#include <cstddef>

#include "backends/cuda/nccl_api.h"

#ifndef FAKE_NCCL_VERSION
#define FAKE_NCCL_VERSION 22807
#endif
#ifndef FAKE_NCCL_OPTIONAL
#define FAKE_NCCL_OPTIONAL 1
#endif
#ifndef FAKE_NCCL_INIT_RANK
#define FAKE_NCCL_INIT_RANK 1
#endif

#define FAKE_NCCL_EXPORT extern "C" __attribute__((visibility("default")))

using ringtree::cuda::NcclComm;
using ringtree::cuda::NcclUniqueId;

FAKE_NCCL_EXPORT int ncclGetVersion(int* version) {
  *version = FAKE_NCCL_VERSION;
  return 0;
}
FAKE_NCCL_EXPORT const char* ncclGetErrorString(int) { return "stand-in NCCL error"; }
FAKE_NCCL_EXPORT int ncclGetUniqueId(NcclUniqueId* id) {
  for (char& byte : id->internal) byte = 0;
  return 0;
}
#if FAKE_NCCL_INIT_RANK
FAKE_NCCL_EXPORT int ncclCommInitRank(NcclComm* comm, int, NcclUniqueId, int) {
  *comm = nullptr;
  return 0;
}
#endif
FAKE_NCCL_EXPORT int ncclCommDestroy(NcclComm) { return 0; }
FAKE_NCCL_EXPORT int ncclCommAbort(NcclComm) { return 0; }
FAKE_NCCL_EXPORT int ncclCommGetAsyncError(NcclComm, int* asyncError) {
  *asyncError = 0;
  return 0;
}
FAKE_NCCL_EXPORT int ncclAllReduce(const void*, void*, size_t, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclBroadcast(const void*, void*, size_t, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclReduce(const void*, void*, size_t, int, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclAllGather(const void*, void*, size_t, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclReduceScatter(const void*, void*, size_t, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclSend(const void*, size_t, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclRecv(void*, size_t, int, int, NcclComm, void*) { return 0; }
FAKE_NCCL_EXPORT int ncclGroupStart() { return 0; }
FAKE_NCCL_EXPORT int ncclGroupEnd() { return 0; }
#if FAKE_NCCL_OPTIONAL
FAKE_NCCL_EXPORT const char* ncclGetLastError(NcclComm) { return ""; }
FAKE_NCCL_EXPORT int ncclCommSplit(NcclComm, int, int, NcclComm* newComm, void*) {
  *newComm = nullptr;
  return 0;
}
FAKE_NCCL_EXPORT int ncclRedOpCreatePreMulSum(int* op, void*, int, int, NcclComm) {
  *op = 5;
  return 0;
}
FAKE_NCCL_EXPORT int ncclRedOpDestroy(int, NcclComm) { return 0; }
#endif
