#include "core/parallel/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace attnserve {

absl::Status Communicator::SendRecv(const void* send_buf, int64_t send_bytes, int peer_send,
                                    void* recv_buf, int64_t recv_bytes, int peer_recv,
                                    const WaitOptions& options) {
  ATTN_ASSIGN_OR_RETURN(PendingTransfer t, StartSendRecv(send_buf, send_bytes, peer_send, recv_buf,
                                                         recv_bytes, peer_recv));
  return Wait(std::move(t), options);
}

namespace {

// How often a blocked Wait wakes to poll the cancel flag: bounds cancellation latency.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

enum class SendPhase { kPosted, kCopying, kDone };

// One posted send. Lives in the (sender -> receiver) mailbox until the receiver takes it.
struct SendEntry {
  const void* buf = nullptr;
  int64_t bytes = 0;
  SendPhase phase = SendPhase::kPosted;
  absl::Status status;  // set by the receiver when the byte counts disagree
};

}  // namespace

struct InProcessCommGroup::Shared {
  explicit Shared(int n) : size(n), mailboxes(static_cast<size_t>(n) * n) {}
  std::deque<std::shared_ptr<SendEntry>>& Mailbox(int from, int to) {
    return mailboxes[static_cast<size_t>(from) * size + to];
  }

  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<std::shared_ptr<SendEntry>>> mailboxes;  // guarded by mu
  absl::Status abort_status;                                      // guarded by mu
};

namespace {

using Shared = InProcessCommGroup::Shared;

class InProcessTransfer final : public PendingTransfer::State {
 public:
  InProcessTransfer(std::shared_ptr<Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}
  // A transfer dropped (or failed) before its send was consumed takes the send back, so no peer
  // ever copies from a buffer its owner may free. A copy already in progress is waited for: it is
  // a memcpy of a bounded size.
  ~InProcessTransfer() override { WithdrawSend(); }

  void WithdrawSend() {
    if (send == nullptr) return;
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (send->phase == SendPhase::kPosted) {
      auto& box = shared_->Mailbox(rank_, peer_send);
      box.erase(std::remove(box.begin(), box.end(), send), box.end());
      send->phase = SendPhase::kDone;
    }
    shared_->cv.wait(lock, [&] { return send->phase == SendPhase::kDone; });
    send.reset();
  }

  std::shared_ptr<Shared> shared_;
  int rank_;
  std::shared_ptr<SendEntry> send;  // null when there is no send half (or it completed)
  int peer_send = kNoPeer;
  void* recv_buf = nullptr;
  int64_t recv_bytes = 0;
  int peer_recv = kNoPeer;
  bool recv_pending = false;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }

  absl::StatusOr<PendingTransfer> StartSendRecv(const void* send_buf, int64_t send_bytes,
                                                int peer_send, void* recv_buf, int64_t recv_bytes,
                                                int peer_recv) override {
    ATTN_RETURN_IF_ERROR(CheckPeer("peer_send", peer_send));
    ATTN_RETURN_IF_ERROR(CheckPeer("peer_recv", peer_recv));
    if (send_bytes < 0 || recv_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "StartSendRecv: byte counts must be >= 0, got send ", send_bytes, ", recv ", recv_bytes));
    }
    auto t = std::make_unique<InProcessTransfer>(shared_, rank_);
    t->peer_send = peer_send;
    t->recv_buf = recv_buf;
    t->recv_bytes = recv_bytes;
    t->peer_recv = peer_recv;
    t->recv_pending = peer_recv != kNoPeer;
    if (peer_send != kNoPeer) {
      t->send = std::make_shared<SendEntry>();
      t->send->buf = send_buf;
      t->send->bytes = send_bytes;
      std::lock_guard<std::mutex> lock(shared_->mu);
      if (!shared_->abort_status.ok()) return shared_->abort_status;
      shared_->Mailbox(rank_, peer_send).push_back(t->send);
      shared_->cv.notify_all();
    }
    return PendingTransfer(std::move(t));
  }

  absl::Status Wait(PendingTransfer transfer, const WaitOptions& options) override {
    auto* t = dynamic_cast<InProcessTransfer*>(transfer.state());
    if (t == nullptr || t->shared_ != shared_ || t->rank_ != rank_) {
      return absl::InvalidArgumentError("Wait: transfer was not started by this communicator");
    }
    const absl::Time deadline = absl::Now() + options.timeout;
    std::unique_lock<std::mutex> lock(shared_->mu);
    while (true) {
      if (!shared_->abort_status.ok()) {
        lock.unlock();
        return shared_->abort_status;  // ~InProcessTransfer withdraws the send
      }
      if (t->recv_pending) {
        auto& box = shared_->Mailbox(t->peer_recv, rank_);
        if (!box.empty()) {
          std::shared_ptr<SendEntry> entry = box.front();
          box.pop_front();
          if (entry->bytes != t->recv_bytes) {
            entry->status = absl::InternalError(absl::StrCat("rank ", t->peer_recv, " sent ",
                                                             entry->bytes, " bytes to rank ", rank_,
                                                             " which expected ", t->recv_bytes));
            entry->phase = SendPhase::kDone;
            shared_->cv.notify_all();
            return entry->status;
          }
          entry->phase = SendPhase::kCopying;
          lock.unlock();
          if (entry->bytes > 0) std::memcpy(t->recv_buf, entry->buf, entry->bytes);
          lock.lock();
          entry->phase = SendPhase::kDone;
          t->recv_pending = false;
          bytes_received_.fetch_add(entry->bytes, std::memory_order_relaxed);
          shared_->cv.notify_all();
          continue;
        }
      }
      if (t->send != nullptr && t->send->phase == SendPhase::kDone) {
        absl::Status s = t->send->status;
        if (s.ok()) bytes_sent_.fetch_add(t->send->bytes, std::memory_order_relaxed);
        t->send.reset();
        if (!s.ok()) return s;
      }
      if (!t->recv_pending && t->send == nullptr) return absl::OkStatus();
      if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
        return absl::CancelledError(absl::StrCat("rank ", rank_, ": transfer cancelled"));
      }
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank_, ": transfer not complete after ", absl::FormatDuration(options.timeout),
            t->recv_pending ? absl::StrCat(" (no data from rank ", t->peer_recv, ")")
                            : absl::StrCat(" (rank ", t->peer_send, " did not take the send)")));
      }
      shared_->cv.wait_until(lock, absl::ToChronoTime(std::min(deadline, now + kPollInterval)));
    }
  }

  void Abort(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->abort_status.ok()) {
      shared_->abort_status =
          status.ok() ? absl::AbortedError("communicator group aborted") : status;
    }
    shared_->cv.notify_all();
  }

  int64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  int64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

 private:
  absl::Status CheckPeer(const char* what, int peer) const {
    if (peer == kNoPeer || (peer >= 0 && peer < shared_->size)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("StartSendRecv: ", what, " must be in [0, ",
                                                   shared_->size, ") or kNoPeer, got ", peer));
  }

  std::shared_ptr<Shared> shared_;
  const int rank_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace

InProcessCommGroup::InProcessCommGroup(int size) : shared_(std::make_shared<Shared>(size)) {
  for (int r = 0; r < size; ++r) {
    comms_.push_back(std::make_unique<InProcessCommunicator>(shared_, r));
  }
}

InProcessCommGroup::~InProcessCommGroup() = default;

absl::StatusOr<std::unique_ptr<InProcessCommGroup>> InProcessCommGroup::Create(int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("InProcessCommGroup: size must be >= 1, got ", size));
  }
  return std::unique_ptr<InProcessCommGroup>(new InProcessCommGroup(size));
}

void InProcessCommGroup::Abort(const absl::Status& status) { comms_[0]->Abort(status); }

}  // namespace attnserve
