#include "backends/cuda/backend_choice.h"

#include <exception>
#include <string>
#include <vector>

#include <ringtree/error.h>

#include "backends/cuda/gpu_runtime.h"
#include "backends/cuda/nccl_backend.h"
#include "backends/cuda/nccl_loader.h"
#include "backends/cuda/staged_backend.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/process_identity.h"

namespace ringtree::cuda {

namespace {

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    parts.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return parts;
    begin = comma + 1;
  }
}

// "<0|1><forced>\n<gpu>": the forced value never holds a newline that matters (it is
// checked against auto|nccl|staged after the exchange).
std::string encode(const CudaRankRecord& record) {
  return (record.ncclUsable ? "1" : "0") + record.forced + "\n" + record.gpu;
}

CudaRankRecord decode(const Bytes& bytes) {
  const std::string text(bytes.begin(), bytes.end());
  CudaRankRecord record;
  record.ncclUsable = !text.empty() && text[0] == '1';
  const size_t newline = text.find('\n');
  if (newline == std::string::npos) return record;
  record.forced = text.substr(1, newline - 1);
  record.gpu = text.substr(newline + 1);
  return record;
}

}  // namespace

std::string gpuIdentity(int device, const std::string& visibleDevices) {
  std::string physical = std::to_string(device);
  if (!visibleDevices.empty()) {
    const std::vector<std::string> visible = splitCommas(visibleDevices);
    if (device >= 0 && static_cast<size_t>(device) < visible.size()) physical = visible[static_cast<size_t>(device)];
  }
  return localBootId() + "/" + physical;
}

std::string chooseCudaBackend(const std::vector<CudaRankRecord>& records, const std::string& forced,
                              std::string* why) {
  if (!forced.empty() && forced != "auto" && forced != "nccl" && forced != "staged") {
    throw InvalidArgument("RINGTREE_CUDA_BACKEND must be auto, nccl or staged, got '" + forced + "'");
  }
  std::string reason;
  for (size_t r = 0; r < records.size() && reason.empty(); ++r) {
    if (!records[r].ncclUsable) reason = "rank " + std::to_string(r) + " has no usable NCCL";
    for (size_t s = r + 1; s < records.size() && reason.empty(); ++s) {
      if (records[r].gpu == records[s].gpu) {
        reason = "ranks " + std::to_string(r) + " and " + std::to_string(s) + " share one GPU, which NCCL refuses";
      }
    }
  }
  if (forced == "staged") {
    *why = "RINGTREE_CUDA_BACKEND=staged";
    return "staged";
  }
  if (reason.empty()) return "nccl";
  if (forced == "nccl") throw Error("RINGTREE_CUDA_BACKEND=nccl, but NCCL cannot serve this group: " + reason);
  *why = reason;
  return "staged";
}

std::unique_ptr<DeviceBackend> makeDefaultCudaBackend(const DeviceBackendContext& context) {
  const RingtreeGpuApi& gpu = loadGpuRuntime();
  std::shared_ptr<const NcclApi> nccl;
  try {
    nccl = loadNccl();
  } catch (const std::exception& error) {
    RINGTREE_INFO("rank " << context.rank << ": " << error.what());
  }
  CudaRankRecord mine;
  mine.gpu = gpuIdentity(context.device.index, env::getString("CUDA_VISIBLE_DEVICES"));
  mine.ncclUsable = nccl != nullptr;
  mine.forced = env::cudaBackend();
  if (mine.forced.find('\n') != std::string::npos) mine.forced = "?";
  context.store->set("rank/" + std::to_string(context.rank), [&] {
    const std::string text = encode(mine);
    return Bytes(text.begin(), text.end());
  }());
  std::vector<std::string> keys;
  for (int r = 0; r < context.size; ++r) keys.push_back("rank/" + std::to_string(r));
  context.store->wait(keys, context.timeout.count() > 0 ? context.timeout : Store::kDefaultTimeout);
  std::vector<CudaRankRecord> records;
  for (const Bytes& bytes : context.store->multiGet(keys)) records.push_back(decode(bytes));

  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].forced != records[0].forced) {
      throw InvalidArgument("RINGTREE_CUDA_BACKEND differs between the ranks of a group: rank 0 has '" +
                            records[0].forced + "', rank " + std::to_string(r) + " '" + records[r].forced + "'");
    }
  }
  std::string why;
  const std::string choice = chooseCudaBackend(records, records[0].forced, &why);
  if (choice == "staged") {
    RINGTREE_INFO("rank " << context.rank << ": CUDA buffers of this group are staged through host memory: " << why);
    return makeStagedBackend(context, gpu);
  }
  return makeNcclBackend(context, gpu, std::move(nccl));
}

}  // namespace ringtree::cuda
