// NcclCommunicator: the Communicator of one GPU worker, over NCCL point-to-point (ncclSend /
// ncclRecv in one group) on a dedicated communication stream, ordered against the worker's
// compute stream with events. Built only with CUDA and NCCL (ATTNSERVE_HAVE_NCCL).
//
// NVLink multicast (NVLS) is forced off: every entry point that can initialise NCCL first sets
// NCCL_NVLS_ENABLE=0, overwriting any inherited value. The shared hosts these servers run on lose
// their GPUs for a long time when a program uses NVLink multicast, and ring attention only needs
// point-to-point sends, which NVLS does not speed up.
//
// Bounded waits: communicators are created non-blocking (ncclConfig_t.blocking = 0) so a rank
// whose peers never join gets DEADLINE_EXCEEDED instead of hanging in ncclCommInitRank, and Wait
// polls the transfer's event with a deadline. Any failure aborts the rank's communicator
// (ncclCommAbort, from the rank's own thread) and marks the shared NcclGroup aborted, which every
// other rank notices within one poll and aborts too. An aborted group must be rebuilt.
#ifndef ATTNSERVE_CORE_PARALLEL_NCCL_COMMUNICATOR_H_
#define ATTNSERVE_CORE_PARALLEL_NCCL_COMMUNICATOR_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/parallel/communicator.h"

namespace attnserve {

// Sets NCCL_NVLS_ENABLE=0 in this process's environment (overwriting). Called by every function
// below that may initialise NCCL; exposed so servers can call it at startup too.
void ForceNcclNvlsOff();

// NCCL result -> absl::Status naming the expression, file:line, NCCL's error string and its last
// error message. ncclInvalidArgument/ncclInvalidUsage -> INVALID_ARGUMENT, ncclSystemError /
// ncclRemoteError -> UNAVAILABLE, others INTERNAL.
absl::Status NcclResultToStatus(ncclResult_t result, const char* expr, const char* file, int line);

// What the ranks of one NCCL communicator share: the unique id and the abort flag.
class NcclGroup {
 public:
  // ncclGetUniqueId for a group of `size` ranks.
  static absl::StatusOr<std::shared_ptr<NcclGroup>> Create(int size);

  int size() const { return size_; }
  const ncclUniqueId& id() const { return id_; }
  // First status wins; every rank's next poll sees it.
  void Abort(const absl::Status& status);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  absl::Status abort_status() const;

 private:
  NcclGroup(int size, const ncclUniqueId& id) : size_(size), id_(id) {}
  const int size_;
  const ncclUniqueId id_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  absl::Status abort_status_;  // guarded by mu_
};

class NcclCommunicator final : public Communicator {
 public:
  struct Options {
    std::shared_ptr<NcclGroup> group;  // required
    int rank = 0;
    int cuda_device = 0;
    // Work queued on this stream before StartSendRecv is finished before the transfer reads its
    // send buffer; after Wait returns, work queued on it sees the received data. May be changed
    // later with set_compute_stream (only by the owning thread).
    cudaStream_t compute_stream = nullptr;
    absl::Duration init_timeout = absl::Seconds(120);
  };

  // Collective: every rank of the group calls it at about the same time, each on its own worker
  // thread (which is bound to cuda_device). DEADLINE_EXCEEDED when the peers do not all join
  // within init_timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(const Options& options);
  // Destroys the communicator (ncclCommDestroy, or nothing more after an abort) and its stream.
  // Call from the owning thread.
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void set_compute_stream(cudaStream_t stream) { compute_stream_ = stream; }
  cudaStream_t comm_stream() const { return comm_stream_; }

  // Buffers are device pointers on cuda_device.
  absl::StatusOr<PendingTransfer> StartSendRecv(const void* send_buf, int64_t send_bytes,
                                                int peer_send, void* recv_buf, int64_t recv_bytes,
                                                int peer_recv) override;
  absl::Status Wait(PendingTransfer transfer, const WaitOptions& options) override;
  // Marks the group aborted; this rank's communicator is aborted by its own thread at its next
  // StartSendRecv/Wait (NCCL calls on one communicator are not made from two threads).
  void Abort(const absl::Status& status) override { group_->Abort(status); }
  int64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  int64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

 private:
  NcclCommunicator() = default;
  // Aborts this rank's NCCL communicator (once) and the group; returns `status`.
  absl::Status Fail(absl::Status status);
  // Polls ncclCommGetAsyncError until the communicator is not ncclInProgress, bounded.
  absl::Status WaitNotInProgress(absl::Time deadline, const std::atomic<bool>* cancel);

  std::shared_ptr<NcclGroup> group_;
  int rank_ = 0;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  bool comm_aborted_ = false;
  // A transfer was started and not yet waited for. NCCL's non-blocking groups allow one
  // outstanding group per communicator, so StartSendRecv refuses a second (FAILED_PRECONDITION).
  bool in_flight_ = false;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream at each StartSendRecv
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_NCCL_COMMUNICATOR_H_
