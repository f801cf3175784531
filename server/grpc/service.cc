// Registration-level parts of the service: creation, drain and the call count. The Attend stream
// is attend_reactor.cc, Describe is describe.cc.
#include "server/grpc/service.h"

#include <malloc.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace attnserve {
namespace {

// 32 random bits as 8 hex digits: the run part of generated request ids.
std::string RandomRunId() {
  std::random_device random;
  return absl::StrFormat("%08x", static_cast<uint32_t>(random()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionServiceImpl>> AttentionServiceImpl::Create(
    const ServiceOptions& options, DevicePool* pool, Scheduler* scheduler, Metrics* metrics) {
  if (pool == nullptr || scheduler == nullptr || metrics == nullptr) {
    return absl::InvalidArgumentError("service: pool, scheduler and metrics are required");
  }
  const AssemblerOptions& l = options.limits;
  if (l.max_request_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-request-bytes: must be > 0, got ", l.max_request_bytes));
  }
  if (l.max_chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-chunk-bytes: must be > 0, got ", l.max_chunk_bytes));
  }
  if (l.default_response_chunk_bytes <= 0 || l.default_response_chunk_bytes > l.max_chunk_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk-bytes: must be in [1, --max-chunk-bytes=", l.max_chunk_bytes,
                     "], got ", l.default_response_chunk_bytes));
  }
  if (options.streams.idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--stream-idle-timeout: must be >= 0, got ",
                                                   absl::FormatDuration(options.streams.idle_timeout)));
  }
  if (options.streams.min_upload_rate < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--min-upload-rate: must be >= 0, got ",
                                                   options.streams.min_upload_rate));
  }
  if (options.streams.min_upload_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-upload-grace: must be >= 0, got ",
                     absl::FormatDuration(options.streams.min_upload_grace)));
  }
  if (options.max_upload_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-upload-bytes: must be >= 0, got ", options.max_upload_bytes));
  }
  if (l.max_spec_entries < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-spec-entries: must be >= 1, got ", l.max_spec_entries));
  }
  if (options.max_regions < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-regions: must be >= 0, got ", options.max_regions));
  }
  ContextStoreOptions contexts = options.contexts;
  std::vector<Device*> devices;
  int64_t device_bytes = 0;
  for (size_t i = 0; i < pool->size(); ++i) {
    devices.push_back(&pool->device(i));
    device_bytes += pool->device(i).Stats().memory_total_bytes;
  }
  if (contexts.memory_budget_bytes == 0) contexts.memory_budget_bytes = device_bytes / 2;
  absl::StatusOr<std::unique_ptr<ContextStore>> store =
      ContextStore::Create(contexts, std::move(devices));
  if (!store.ok()) return store.status();
  return std::unique_ptr<AttentionServiceImpl>(
      new AttentionServiceImpl(options, pool, scheduler, metrics, *std::move(store)));
}

AttentionServiceImpl::AttentionServiceImpl(const ServiceOptions& options, DevicePool* pool,
                                           Scheduler* scheduler, Metrics* metrics,
                                           std::unique_ptr<ContextStore> contexts)
    : options_(options),
      pool_(pool),
      scheduler_(scheduler),
      metrics_(metrics),
      contexts_(std::move(contexts)),
      run_id_(RandomRunId()) {
  RegionRegistryOptions regions;
  regions.max_regions = options.max_regions;
  regions.host_memory = &pool->device(0).host_memory();
  regions_ = MakeRegionRegistry(regions);
  RegionRegistry* registry = regions_.get();
  metrics_->SetRegionSource([registry] { return registry->Totals(); });
  ContextStore* store = contexts_.get();
  metrics_->SetContextSource([store] { return store->Totals(); });
  MemoryTracker* requests = &request_memory_;
  metrics_->SetRequestBufferSource([requests] { return requests->in_use_bytes(); });
  upload_budget_ = std::make_unique<UploadBudget>(options.max_upload_bytes, "--max-upload-bytes");
  watchdog_ = std::make_unique<StreamWatchdog>(StreamWatchdog::PeriodFor(options.streams),
                                               [this] { TrimIfIdle(); });
}

void AttentionServiceImpl::TrimIfIdle() {
  // Request buffers are mmap'ed and unmapped (PlainHostMemory), but gRPC's and protobuf's message
  // buffers come from malloc: once nothing is in progress, hand the free pages of every arena
  // back, so a burst of uploads does not leave the process hundreds of MB larger.
  if (!options_.trim_when_idle || !trim_pending_.load()) return;
  if (active_calls() != 0) return;
  trim_pending_.store(false);
  malloc_trim(0);
}

AttentionServiceImpl::~AttentionServiceImpl() {
  metrics_->SetRegionSource(nullptr);
  metrics_->SetContextSource(nullptr);
  metrics_->SetRequestBufferSource(nullptr);
  contexts_->DeleteAll();
  regions_->ReleaseAll();
}

void AttentionServiceImpl::CallStarted() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  ++active_calls_;
}

void AttentionServiceImpl::CallEnded() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  --active_calls_;
  if (active_calls_ == 0) {
    trim_pending_.store(true);
    calls_cv_.notify_all();
  }
}

bool AttentionServiceImpl::WaitForIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(calls_mu_);
  while (active_calls_ > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    calls_cv_.wait_for(lock, absl::ToChronoNanoseconds(std::min(left, absl::Milliseconds(100))));
  }
  return true;
}

int64_t AttentionServiceImpl::active_calls() const {
  std::lock_guard<std::mutex> lock(calls_mu_);
  return active_calls_;
}

std::string AttentionServiceImpl::NextRequestId() {
  return absl::StrFormat("req-%s-%06d", run_id_, next_id_.fetch_add(1));
}

}  // namespace attnserve
