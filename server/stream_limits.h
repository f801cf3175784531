// Limits on what a client stream may hold on the server: how long it may stay silent, how slowly
// it may upload, and how many request-buffer bytes all uploads may hold together. A stream that
// sends a header and then goes quiet would otherwise keep its buffers (and a gRPC call) forever.
//
// One StreamWatchdog thread checks every registered stream a few times a second, so a server with
// thousands of open streams has one timer thread, not one per stream. The streams decide for
// themselves (WatchedStream::CheckLimits, usually through CheckUpload) what their limits mean in
// their current stage.
#ifndef ATTNSERVE_SERVER_STREAM_LIMITS_H_
#define ATTNSERVE_SERVER_STREAM_LIMITS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve {

struct StreamLimits {
  // A stream still uploading (or, for Attend, waiting for the client's half-close after the
  // response) that sends no message for this long is ended with DEADLINE_EXCEEDED. Zero: off.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Once `min_upload_grace` has passed since the call started, a stream still uploading whose
  // average rate (payload bytes since the start / seconds since the start) is below this many
  // bytes per second is ended with DEADLINE_EXCEEDED. 0: off.
  int64_t min_upload_rate = 16 << 10;
  absl::Duration min_upload_grace = absl::Seconds(30);
};

// The verdict on a stream that is uploading: the status to end it with (DEADLINE_EXCEEDED, naming
// the flag), or nothing. `start`: the call's start; `last_message`: when its last message arrived
// (the start before any); `bytes`: payload bytes received so far; `stage`: for the message
// ("receiving the request").
std::optional<absl::Status> CheckUpload(const StreamLimits& limits, absl::Time start,
                                        absl::Time last_message, int64_t bytes, absl::Time now,
                                        absl::string_view stage);
// The idle rule alone (a stream that is not uploading but owes the server a message).
std::optional<absl::Status> CheckIdle(const StreamLimits& limits, absl::Time last_message,
                                      absl::Time now, absl::string_view stage);

class WatchedStream {
 public:
  virtual ~WatchedStream() = default;
  // Called on the watchdog thread with its registry locked (so the stream cannot be removed,
  // hence not deleted, meanwhile). Must not block: a stream busy under its own lock skips this
  // round (it is not idle). Returns what to run once the registry is unlocked -- typically the
  // gRPC Finish of a stream it has just ended -- or an empty function.
  virtual std::function<void()> CheckLimits(absl::Time now) = 0;
};

// The one timer thread of the service's streams.
class StreamWatchdog {
 public:
  // Checks every `period`. `on_tick` (optional) runs after each round, outside the registry lock.
  explicit StreamWatchdog(absl::Duration period, std::function<void()> on_tick = nullptr);
  ~StreamWatchdog();  // stops the thread; streams must have been removed
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  void Add(WatchedStream* stream);
  // After Remove returns, the watchdog does not touch `stream` again.
  void Remove(WatchedStream* stream);
  size_t size() const;

  // The check period for these limits: a tenth of the shortest limit, in [10 ms, 250 ms].
  static absl::Duration PeriodFor(const StreamLimits& limits);

 private:
  void Loop();

  const absl::Duration period_;
  const std::function<void()> on_tick_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::unordered_set<WatchedStream*> streams_;
  std::thread thread_;
};

// A server-wide cap on request-buffer bytes (Q, K, V of Attend calls and the staged rows of
// AppendContext calls in progress): a header whose buffers do not fit in what is left is refused
// at once with RESOURCE_EXHAUSTED naming `flag` (no waiting: the caller retries with backoff, as
// for a full queue). Thread-safe.
class UploadBudget {
 public:
  // cap <= 0: no cap (Reserve always succeeds, and still counts).
  UploadBudget(int64_t cap, std::string flag) : cap_(cap), flag_(std::move(flag)) {}

  // A reservation, released when destroyed (or on Release).
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept;
    ~Reservation() { Release(); }
    void Release();
    int64_t bytes() const { return bytes_; }

   private:
    friend class UploadBudget;
    UploadBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // `bytes` more, or RESOURCE_EXHAUSTED "<what> needs N bytes of request buffers but requests in
  // progress hold H of the M allowed (--max-upload-bytes)".
  absl::Status Reserve(int64_t bytes, absl::string_view what, Reservation* out);
  int64_t held_bytes() const { return held_.load(std::memory_order_relaxed); }
  int64_t cap() const { return cap_; }

 private:
  const int64_t cap_;
  const std::string flag_;
  std::atomic<int64_t> held_{0};
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_STREAM_LIMITS_H_
