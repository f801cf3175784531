// Communicator: what one rank of a group of workers needs to run a ring: its rank, the group size
// and a grouped send/recv that runs asynchronously (start it, compute, wait for it), so the K/V
// transfer of ring step t+1 overlaps the compute of step t.
//
// Two implementations: InProcessCommGroup (below; CPU workers, one thread per rank, buffers in
// host memory) and NcclCommunicator (nccl_communicator.h; one GPU per rank, device buffers).
// Every wait is bounded: a peer that never shows up gives DEADLINE_EXCEEDED, a cancelled request
// gives CANCELLED, and Abort() releases every rank blocked in the group.
#ifndef ATTNSERVE_CORE_PARALLEL_COMMUNICATOR_H_
#define ATTNSERVE_CORE_PARALLEL_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve {

// A transfer started by Communicator::StartSendRecv. Move-only; pass it to Wait exactly once.
// Dropping one without Wait withdraws what can be withdrawn (the in-process send is taken back
// so no peer reads a buffer that may be freed) but leaves the group unusable for further
// transfers: the caller must Abort the group.
class PendingTransfer {
 public:
  // Implementation-specific state; each Communicator only ever sees its own kind.
  class State {
   public:
    virtual ~State() = default;
  };

  PendingTransfer() = default;
  explicit PendingTransfer(std::unique_ptr<State> state) : state_(std::move(state)) {}
  PendingTransfer(PendingTransfer&&) = default;
  PendingTransfer& operator=(PendingTransfer&&) = default;

  bool valid() const { return state_ != nullptr; }
  State* state() const { return state_.get(); }
  std::unique_ptr<State> Release() { return std::move(state_); }

 private:
  std::unique_ptr<State> state_;
};

// How long a Wait may block and what interrupts it.
struct WaitOptions {
  absl::Duration timeout = absl::Seconds(60);
  // Polled while waiting (at least every 10 ms); when it reads true Wait returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

// No peer for one half of StartSendRecv.
inline constexpr int kNoPeer = -1;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts sending send_bytes from send_buf to rank peer_send and receiving recv_bytes into
  // recv_buf from rank peer_recv, as one group (neither half waits for the other to be matched,
  // so a ring of StartSendRecv calls cannot deadlock). Either half is skipped with kNoPeer.
  // Sends and receives between a pair of ranks match in the order they were started, and the
  // byte counts of a matched pair must agree (else both sides get INTERNAL).
  // Until Wait returns, send_buf must not be written and recv_buf must not be touched; both may
  // be read by other code (the ring computes on the buffer it is sending).
  // Buffers live in the implementation's memory space: host for in-process, device for NCCL.
  // Portable callers keep at most one transfer per communicator outstanding (Wait before the next
  // StartSendRecv), which is all a double-buffered ring needs; NCCL enforces it.
  virtual absl::StatusOr<PendingTransfer> StartSendRecv(const void* send_buf, int64_t send_bytes,
                                                        int peer_send, void* recv_buf,
                                                        int64_t recv_bytes, int peer_recv) = 0;

  // Blocks until both halves of `transfer` completed: recv_buf holds the data and send_buf may be
  // reused. DEADLINE_EXCEEDED after options.timeout, CANCELLED when options.cancel is set, the
  // abort status after Abort(). After any error the group must be aborted and rebuilt.
  virtual absl::Status Wait(PendingTransfer transfer, const WaitOptions& options) = 0;

  // StartSendRecv then Wait.
  absl::Status SendRecv(const void* send_buf, int64_t send_bytes, int peer_send, void* recv_buf,
                        int64_t recv_bytes, int peer_recv, const WaitOptions& options);

  // Fails the whole group: every rank's current and future waits return `status` promptly. Used
  // when one rank fails or the request is cancelled, so its peers never block until a timeout.
  // Thread-safe; idempotent (the first status wins).
  virtual void Abort(const absl::Status& status) = 0;

  // Bytes this rank has sent / received over completed transfers since creation. Thread-safe
  // (the metrics thread reads them for attnserve_nccl_bytes_total{device,direction}).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

// P communicators for P worker threads of one process, exchanging host buffers. Rendezvous
// protocol: a send posts (pointer, bytes) in the (sender -> receiver) mailbox; the receiver's
// Wait copies straight from the sender's buffer (one memcpy, no staging) and marks the send done;
// the sender's Wait returns once its send is done. One mutex and condition variable per group:
// groups are small (one rank per CPU worker) and the copy itself runs outside the lock.
class InProcessCommGroup {
 public:
  // INVALID_ARGUMENT unless size >= 1.
  static absl::StatusOr<std::unique_ptr<InProcessCommGroup>> Create(int size);
  ~InProcessCommGroup();

  int size() const { return static_cast<int>(comms_.size()); }
  // Rank `rank`'s communicator; owned by the group, valid for the group's lifetime. Each is used
  // by one thread at a time.
  Communicator* comm(int rank) const { return comms_[rank].get(); }
  // Same as comm(r)->Abort(status) for any r.
  void Abort(const absl::Status& status);

  // Shared by the group's communicators and their pending transfers (which may outlive a Wait
  // that timed out); public only so the implementation file can name it.
  struct Shared;

 private:
  explicit InProcessCommGroup(int size);
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_CORE_PARALLEL_COMMUNICATOR_H_
