#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ringtree/communicator.h>
#include <ringtree/device_backend.h>
#include <ringtree/p2p.h>

#include "backends/operation_queue.h"

namespace ringtree::detail {

// ringtree's CPU engine behind a ProcessGroup (torch's "gloo" role): the collectives of
// <ringtree/collectives.h> over one communicator, run one at a time in submission order
// by an OperationQueue (synchronous calls inline when it is idle), and point-to-point over
// a PointToPoint engine with a communicator of its own.
//
// Operations capture raw pointers to the communicators: shutdown()/abort(), which the
// destructor calls, return only once no operation runs any more.
class CpuBackend final : public DeviceBackend {
 public:
  // `collectives` must not be null; `pointToPoint` may be (send/recv then throw Error).
  CpuBackend(std::shared_ptr<Communicator> collectives, std::shared_ptr<Communicator> pointToPoint);
  // shutdown().
  ~CpuBackend() override;

  DeviceType deviceType() const override { return DeviceType::kCpu; }
  const char* name() const override { return "cpu"; }

  std::shared_ptr<Work> allreduce(const BufferView& tensor, const AllreduceOptions& options,
                                  const Submission& submission) override;
  std::shared_ptr<Work> allreduceCoalesced(const std::vector<BufferView>& tensors, const AllreduceOptions& options,
                                           const Submission& submission) override;
  std::shared_ptr<Work> broadcast(const BufferView& tensor, const BroadcastOptions& options,
                                  const Submission& submission) override;
  std::shared_ptr<Work> reduce(const BufferView& tensor, const ReduceOptions& options,
                               const Submission& submission) override;
  std::shared_ptr<Work> allgather(const std::vector<BufferView>& tensorList, const BufferView& tensor,
                                  const AllgatherOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> allgatherSingle(const BufferView& outputTensor, const BufferView& inputTensor,
                                        const AllgatherOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> allgatherCoalesced(const std::vector<std::vector<BufferView>>& outputTensorLists,
                                           const std::vector<BufferView>& inputTensorList,
                                           const AllgatherOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> gather(const BufferView& tensor, const std::vector<BufferView>& gatherList,
                               const GatherOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> scatter(const BufferView& tensor, const std::vector<BufferView>& scatterList,
                                const ScatterOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> reduceScatter(const BufferView& output, const std::vector<BufferView>& inputList,
                                      const ReduceScatterOptions& options, const Submission& submission) override;
  std::shared_ptr<Work> reduceScatterSingle(const BufferView& output, const BufferView& input,
                                            const ReduceScatterOptions& options,
                                            const Submission& submission) override;
  std::shared_ptr<Work> reduceScatterSingleCoalesced(const std::vector<BufferView>& outputs,
                                                     const std::vector<BufferView>& inputs,
                                                     const ReduceScatterOptions& options,
                                                     const Submission& submission) override;
  std::shared_ptr<Work> alltoall(const std::vector<BufferView>& outputTensorList,
                                 const std::vector<BufferView>& inputTensorList, const AlltoallOptions& options,
                                 const Submission& submission) override;
  std::shared_ptr<Work> alltoallSingle(const BufferView& output, const BufferView& input,
                                       const std::vector<int64_t>& outputSplitSizes,
                                       const std::vector<int64_t>& inputSplitSizes, const AlltoallOptions& options,
                                       const Submission& submission) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& options, const Submission& submission) override;

  void send(const BufferView& tensor, int dst, int tag) override;
  int recv(const BufferView& tensor, int src, int tag) override;
  std::shared_ptr<Work> isend(const BufferView& tensor, int dst, int tag, std::shared_ptr<void> keepAlive) override;
  std::shared_ptr<Work> irecv(const BufferView& tensor, int src, int tag, std::shared_ptr<void> keepAlive) override;

  // Runs the queued collectives, then stops the worker; fails pending point-to-point
  // operations. Idempotent.
  void shutdown() override;
  // See ProcessGroup::abort(); afterwards the connections and the node arena are closed.
  void abort() override;
  bool isShutdown() const { return queue_->isShutdown(); }

  Communicator& communicator() { return *collectives_; }
  uint64_t inlineCallCount() const { return queue_->inlineCallCount(); }

 private:
  // Runs body(communicator, args...) as the operation `opName` under `submission`: inline
  // or queued and waited for (sync, args used in place), or queued with copies of args
  // (async).
  template <typename Body, typename... Args>
  std::shared_ptr<Work> run(const char* opName, const Submission& submission, Body body, const Args&... args);
  PointToPoint& pointToPoint(const char* op);

  std::shared_ptr<Communicator> collectives_;
  std::unique_ptr<PointToPoint> p2p_;  // null without point-to-point
  std::shared_ptr<OperationQueue> queue_;
};

}  // namespace ringtree::detail
