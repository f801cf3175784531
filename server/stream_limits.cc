#include "server/stream_limits.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace attnserve {

std::optional<absl::Status> CheckIdle(const StreamLimits& limits, absl::Time last_message,
                                      absl::Time now, absl::string_view stage) {
  if (limits.idle_timeout <= absl::ZeroDuration()) return std::nullopt;
  const absl::Duration idle = now - last_message;
  if (idle < limits.idle_timeout) return std::nullopt;
  return absl::DeadlineExceededError(absl::StrFormat(
      "idle: no message for %.1fs while %s (limit --stream-idle-timeout=%s)",
      absl::ToDoubleSeconds(idle), stage, absl::FormatDuration(limits.idle_timeout)));
}

std::optional<absl::Status> CheckUpload(const StreamLimits& limits, absl::Time start,
                                        absl::Time last_message, int64_t bytes, absl::Time now,
                                        absl::string_view stage) {
  if (std::optional<absl::Status> idle = CheckIdle(limits, last_message, now, stage)) return idle;
  if (limits.min_upload_rate <= 0) return std::nullopt;
  const absl::Duration elapsed = now - start;
  if (elapsed < limits.min_upload_grace || elapsed <= absl::ZeroDuration()) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(elapsed);
  const double rate = static_cast<double>(bytes) / seconds;
  if (rate >= static_cast<double>(limits.min_upload_rate)) return std::nullopt;
  return absl::DeadlineExceededError(absl::StrFormat(
      "upload too slow: %d bytes in %.1fs (%.0f bytes/s) while %s, below --min-upload-rate=%d "
      "(bytes/s, checked after --min-upload-grace=%s)",
      bytes, seconds, rate, stage, limits.min_upload_rate,
      absl::FormatDuration(limits.min_upload_grace)));
}

StreamWatchdog::StreamWatchdog(absl::Duration period, std::function<void()> on_tick)
    : period_(period), on_tick_(std::move(on_tick)) {
  thread_ = std::thread([this] { Loop(); });
}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWatchdog::Add(WatchedStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.insert(stream);
}

void StreamWatchdog::Remove(WatchedStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
}

size_t StreamWatchdog::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_.size();
}

absl::Duration StreamWatchdog::PeriodFor(const StreamLimits& limits) {
  absl::Duration shortest = absl::Milliseconds(2500);
  if (limits.idle_timeout > absl::ZeroDuration()) shortest = std::min(shortest, limits.idle_timeout);
  if (limits.min_upload_rate > 0 && limits.min_upload_grace > absl::ZeroDuration()) {
    shortest = std::min(shortest, limits.min_upload_grace);
  }
  return std::clamp(shortest / 10, absl::Milliseconds(10), absl::Milliseconds(250));
}

void StreamWatchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::function<void()>> later;
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(period_), [this] { return stop_; });
    if (stop_) break;
    const absl::Time now = absl::Now();
    for (WatchedStream* stream : streams_) {
      if (std::function<void()> f = stream->CheckLimits(now)) later.push_back(std::move(f));
    }
    lock.unlock();
    // gRPC may run a reaction (even OnDone, which calls Remove) inline from Finish: never with
    // the registry locked.
    for (std::function<void()>& f : later) f();
    later.clear();
    if (on_tick_) on_tick_();
    lock.lock();
  }
}

UploadBudget::Reservation& UploadBudget::Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    Release();
    budget_ = std::exchange(o.budget_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void UploadBudget::Reservation::Release() {
  if (budget_ != nullptr) budget_->held_.fetch_sub(bytes_, std::memory_order_relaxed);
  budget_ = nullptr;
  bytes_ = 0;
}

absl::Status UploadBudget::Reserve(int64_t bytes, absl::string_view what, Reservation* out) {
  int64_t held = held_.load(std::memory_order_relaxed);
  for (;;) {
    if (cap_ > 0 && (bytes > cap_ || held > cap_ - bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", bytes, " bytes of request buffers but requests in progress hold ",
          held, " of the ", cap_, " allowed (limit ", flag_, "=", cap_, ")"));
    }
    if (held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed)) break;
  }
  out->Release();
  out->budget_ = this;
  out->bytes_ = bytes;
  return absl::OkStatus();
}

}  // namespace attnserve
