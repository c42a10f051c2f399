#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/nccl_api.h"

// Finding and opening NCCL at run time (dlopen); ringtree never links it at build time.
namespace ringtree::cuda {

// The oldest NCCL ringtree drives: 2.10 (bfloat16 and ncclAvg).
constexpr int kMinNcclVersion = 21000;

// Where loadNccl() looks, in order:
//  1. a libnccl.so.2 this process has already loaded (torch's, when torch came first),
//  2. the nvidia-nccl-cu13 / nvidia-nccl-cu12 wheels' library next to the installed
//     package: <site-packages>/nvidia/nccl/lib/libnccl.so.2 (and nvidia/cu13/lib), where
//     <site-packages> is two folders above the file holding ringtree's core,
//  3. RINGTREE_NCCL_PATH: the library file itself, or a folder holding libnccl.so.2,
//  4. the system's: libnccl.so.2 through the dynamic loader's search path.
// Each entry is a path for dlopen, or "loaded:libnccl.so.2" for the first kind.
std::vector<std::string> ncclCandidates();

// Opens the first candidate that exists and fills the table; the handle stays open for
// the life of the process. Throws ringtree::Error naming every candidate tried when none
// loads; naming the file and its version when it is older than kMinNcclVersion; naming
// the file and the missing function when a required symbol is absent.
std::shared_ptr<const NcclApi> loadNcclFrom(const std::vector<std::string>& candidates);

// loadNcclFrom(ncclCandidates()), once per process: later calls return the same table,
// or rethrow the same error.
std::shared_ptr<const NcclApi> loadNccl();

}  // namespace ringtree::cuda
