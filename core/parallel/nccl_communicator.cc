#include "core/parallel/nccl_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/cuda/cuda_status.h"
#include "core/util/status_macros.h"

#define NCCL_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                      \
    const ncclResult_t attn_nccl_result_ = (expr);                                          \
    if (attn_nccl_result_ != ncclSuccess && attn_nccl_result_ != ncclInProgress) {          \
      return ::attnserve::NcclResultToStatus(attn_nccl_result_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

namespace attnserve {
namespace {

// Poll back-off of bounded waits: short first (a ring step's transfer is often done by the time
// the step's compute is), capped so an idle waiter costs little CPU.
constexpr absl::Duration kFirstPoll = absl::Microseconds(20);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(1);

class NcclTransfer final : public PendingTransfer::State {
 public:
  ~NcclTransfer() override {
    if (done != nullptr) cudaEventDestroy(done);
  }
  cudaEvent_t done = nullptr;  // recorded on the comm stream after the grouped send/recv
  bool recorded = false;       // false while NCCL was still enqueuing at StartSendRecv
  int64_t send_bytes = 0;
  int64_t recv_bytes = 0;
  const void* owner = nullptr;
};

}  // namespace

void ForceNcclNvlsOff() {
  // Overwrite, not just default: an inherited NCCL_NVLS_ENABLE=1 must not turn it on.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
}

absl::Status NcclResultToStatus(ncclResult_t result, const char* expr, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(file, ":", line, ": ", expr, ": ", ncclGetErrorString(result));
  if (const char* last = ncclGetLastError(nullptr); last != nullptr && last[0] != '\0') {
    absl::StrAppend(&msg, " (", last, ")");
  }
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclGroup::Create(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("NcclGroup: size must be >= 1, got ", size));
  }
  ForceNcclNvlsOff();
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  return std::shared_ptr<NcclGroup>(new NcclGroup(size, id));
}

void NcclGroup::Abort(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_status_.ok()) {
    abort_status_ = status.ok() ? absl::AbortedError("NCCL group aborted") : status;
  }
  aborted_.store(true, std::memory_order_release);
}

absl::Status NcclGroup::abort_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_status_;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(const Options& options) {
  if (options.group == nullptr) {
    return absl::InvalidArgumentError("NcclCommunicator: options.group is required");
  }
  if (options.rank < 0 || options.rank >= options.group->size()) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicator: rank must be in [0, ",
                                                   options.group->size(), "), got ", options.rank));
  }
  ForceNcclNvlsOff();
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->group_ = options.group;
  c->rank_ = options.rank;
  c->device_ = options.cuda_device;
  c->compute_stream_ = options.compute_stream;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(options.cuda_device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->comm_stream_, cudaStreamNonBlocking));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&c->ready_, cudaEventDisableTiming));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that init and group calls return and we can bound the wait
  ncclUniqueId id = options.group->id();
  const ncclResult_t r =
      ncclCommInitRankConfig(&c->comm_, options.group->size(), id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    absl::Status s = NcclResultToStatus(r, "ncclCommInitRankConfig", __FILE__, __LINE__);
    if (c->comm_ != nullptr) (void)c->Fail(s);
    options.group->Abort(s);
    return s;
  }
  ATTN_RETURN_IF_ERROR(c->WaitNotInProgress(absl::Now() + options.init_timeout, nullptr));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    cudaSetDevice(device_);
    if (!comm_aborted_) {
      // Outstanding operations would make ncclCommDestroy wait; the owner Waited for every
      // transfer (or the group was aborted), so this returns promptly.
      cudaStreamSynchronize(comm_stream_);
      ncclCommDestroy(comm_);
    }
  }
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  // Peers first: ncclCommAbort can take as long as the peers keep their side of the
  // communicator busy, and they only stop once they see the group aborted.
  group_->Abort(status);
  if (comm_ != nullptr && !comm_aborted_) {
    comm_aborted_ = true;
    ncclCommAbort(comm_);  // releases this rank's queued NCCL work
  }
  return status;
}

absl::Status NcclCommunicator::WaitNotInProgress(absl::Time deadline,
                                                 const std::atomic<bool>* cancel) {
  absl::Duration poll = kFirstPoll;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) {
      return Fail(NcclResultToStatus(r, "ncclCommGetAsyncError", __FILE__, __LINE__));
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return Fail(NcclResultToStatus(state, "NCCL communicator", __FILE__, __LINE__));
    }
    if (group_->aborted()) return Fail(group_->abort_status());
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return Fail(absl::CancelledError(absl::StrCat("NCCL rank ", rank_, ": cancelled")));
    }
    if (absl::Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("NCCL rank ", rank_,
                       ": communicator still in progress at the deadline "
                       "(peers missing?)")));
    }
    absl::SleepFor(poll);
    poll = std::min(poll * 2, kMaxPoll);
  }
}

absl::StatusOr<PendingTransfer> NcclCommunicator::StartSendRecv(const void* send_buf,
                                                                int64_t send_bytes, int peer_send,
                                                                void* recv_buf, int64_t recv_bytes,
                                                                int peer_recv) {
  const int n = size();
  auto bad_peer = [n](int peer) { return peer != kNoPeer && (peer < 0 || peer >= n); };
  if (bad_peer(peer_send) || bad_peer(peer_recv) || send_bytes < 0 || recv_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartSendRecv: peers must be in [0, ", n, ") or kNoPeer and byte counts >= 0, got send ",
        send_bytes, " to ", peer_send, ", recv ", recv_bytes, " from ", peer_recv));
  }
  if (comm_aborted_) return group_->abort_status();
  if (group_->aborted()) return Fail(group_->abort_status());
  if (in_flight_) {
    return absl::FailedPreconditionError(
        "StartSendRecv: the previous transfer of this NCCL communicator was not waited for");
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  auto t = std::make_unique<NcclTransfer>();
  t->owner = this;
  t->send_bytes = peer_send == kNoPeer ? 0 : send_bytes;
  t->recv_bytes = peer_recv == kNoPeer ? 0 : recv_bytes;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming));
  // The send buffer was written by work on the compute stream: the comm stream waits for it.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, compute_stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_stream_, ready_, 0));
  NCCL_RETURN_IF_ERROR(ncclGroupStart());
  if (t->send_bytes > 0) {
    NCCL_RETURN_IF_ERROR(ncclSend(send_buf, static_cast<size_t>(send_bytes), ncclUint8, peer_send,
                                  comm_, comm_stream_));
  }
  if (t->recv_bytes > 0) {
    NCCL_RETURN_IF_ERROR(ncclRecv(recv_buf, static_cast<size_t>(recv_bytes), ncclUint8, peer_recv,
                                  comm_, comm_stream_));
  }
  const ncclResult_t end = ncclGroupEnd();
  if (end != ncclSuccess && end != ncclInProgress) {
    return Fail(NcclResultToStatus(end, "ncclGroupEnd()", __FILE__, __LINE__));
  }
  // A non-blocking communicator may still be enqueuing (the first transfer to a peer also sets up
  // the connection, which needs the peer's matching call): the stream holds the operations only
  // once the communicator leaves ncclInProgress. Waiting for that here would serialise the ranks
  // before any compute, so the done event is recorded here when possible and otherwise by Wait.
  ncclResult_t state = ncclSuccess;
  NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(t->done, comm_stream_));
    t->recorded = true;
  } else if (state != ncclInProgress) {
    return Fail(NcclResultToStatus(state, "ncclSend/ncclRecv group", __FILE__, __LINE__));
  }
  in_flight_ = true;
  return PendingTransfer(std::move(t));
}

absl::Status NcclCommunicator::Wait(PendingTransfer transfer, const WaitOptions& options) {
  auto* t = dynamic_cast<NcclTransfer*>(transfer.state());
  if (t == nullptr || t->owner != this) {
    return absl::InvalidArgumentError("Wait: transfer was not started by this communicator");
  }
  if (comm_aborted_) return group_->abort_status();
  in_flight_ = false;
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const absl::Time deadline = absl::Now() + options.timeout;
  if (!t->recorded) {
    ATTN_RETURN_IF_ERROR(WaitNotInProgress(deadline, options.cancel));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(t->done, comm_stream_));
    t->recorded = true;
  }
  absl::Duration poll = kFirstPoll;
  while (true) {
    const cudaError_t q = cudaEventQuery(t->done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      return Fail(CudaErrorToStatus(q, "cudaEventQuery(done)", __FILE__, __LINE__));
    }
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress) {
      return Fail(NcclResultToStatus(state, "NCCL send/recv", __FILE__, __LINE__));
    }
    if (group_->aborted()) return Fail(group_->abort_status());
    if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
      return Fail(absl::CancelledError(absl::StrCat("NCCL rank ", rank_, ": transfer cancelled")));
    }
    if (absl::Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat("NCCL rank ", rank_,
                                                           ": transfer not complete after ",
                                                           absl::FormatDuration(options.timeout))));
    }
    absl::SleepFor(poll);
    poll = std::min(poll * 2, kMaxPoll);
  }
  // Later compute reads the received buffer (and may overwrite the sent one) on its own stream.
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_stream_, t->done, 0));
  bytes_sent_.fetch_add(t->send_bytes, std::memory_order_relaxed);
  bytes_received_.fetch_add(t->recv_bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace attnserve
