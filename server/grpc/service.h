// The gRPC service. Attend is a bidi reactor per call: its reactions (gRPC threads) only parse,
// validate, copy chunks into the request's host tensors and enqueue the complete request on the
// Scheduler; a device worker runs it and hands the outputs back, and the reactor streams them.
#ifndef ATTNSERVE_SERVER_GRPC_SERVICE_H_
#define ATTNSERVE_SERVER_GRPC_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "core/tensor/tensor.h"
#include "server/auth/principals.h"
#include "server/contexts/context_store.h"
#include "server/device_pool.h"
#include "server/metrics.h"
#include "server/regions/region_registry.h"
#include "server/request_assembler.h"
#include "server/scheduler.h"
#include "server/stream_limits.h"

namespace attnserve {

struct ServiceOptions {
  // Request limits (max_request_bytes, max_chunk_bytes) and the default response chunk size.
  AssemblerOptions limits;  // `tracker` is ignored: the service charges its own
  int max_queue = 64;       // reported by Describe (the scheduler enforces it)
  int max_regions = 64;     // shared-memory regions registered at once (--max-regions)
  // Contexts (--context-memory-bytes, --context-ttl, --max-contexts). A budget of 0 means half of
  // the devices' memory together.
  ContextStoreOptions contexts;
  // Idle and minimum-rate limits of Attend and AppendContext streams (--stream-idle-timeout,
  // --min-upload-rate, --min-upload-grace), checked by one watchdog thread.
  StreamLimits streams;
  // Request-buffer bytes all calls in progress may hold together (--max-upload-bytes); 0: no cap.
  int64_t max_upload_bytes = 0;
  // Give freed heap memory back to the OS (malloc_trim) whenever the last call in progress ends.
  bool trim_when_idle = true;
  // Who may call (--token-file; server/auth/principals.h). Null: no tokens, every caller is the
  // anonymous principal "" without limits of its own. Not owned; must outlive the service.
  const auth::Authenticator* authenticator = nullptr;
  // --auth-discovery: Describe needs a token too (with an authenticator; reflection is gated in
  // main.cc, health never).
  bool describe_needs_token = false;
};

// A context's figures as the wire reports them (ContextStatus).
void ContextStatusToProto(const ContextInfo& info, v1::ContextStatus* out);

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // `pool`, `scheduler` and `metrics` must outlive the service and the grpc::Server using it.
  static absl::StatusOr<std::unique_ptr<AttentionServiceImpl>> Create(const ServiceOptions& options,
                                                                      DevicePool* pool,
                                                                      Scheduler* scheduler,
                                                                      Metrics* metrics);

  grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* Attend(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeResponse* response) override;
  // Shared-memory regions (grpc/regions.cc).
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const v1::RegisterRegionRequest* request,
                                           v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const v1::UnregisterRegionRequest* request,
                                             v1::UnregisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* context,
                                        const v1::ListRegionsRequest* request,
                                        v1::ListRegionsResponse* response) override;
  // Contexts (grpc/contexts.cc).
  grpc::ServerUnaryReactor* CreateContext(grpc::CallbackServerContext* context,
                                          const v1::CreateContextRequest* request,
                                          v1::CreateContextResponse* response) override;
  grpc::ServerReadReactor<v1::AppendContextRequest>* AppendContext(
      grpc::CallbackServerContext* context, v1::AppendContextResponse* response) override;
  grpc::ServerUnaryReactor* GetContext(grpc::CallbackServerContext* context,
                                       const v1::GetContextRequest* request,
                                       v1::GetContextResponse* response) override;
  grpc::ServerUnaryReactor* DeleteContext(grpc::CallbackServerContext* context,
                                          const v1::DeleteContextRequest* request,
                                          v1::DeleteContextResponse* response) override;
  grpc::ServerUnaryReactor* ListContexts(grpc::CallbackServerContext* context,
                                         const v1::ListContextsRequest* request,
                                         v1::ListContextsResponse* response) override;
  ~AttentionServiceImpl() override;

  // From now on new Attend calls fail with UNAVAILABLE "server is draining"; calls in progress
  // continue.
  void StartDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // Called right before grpc::Server::Shutdown cancels the calls still running after the drain:
  // their outcome (log line, metrics) is then the shutdown's UNAVAILABLE, not a client cancel.
  void MarkStopping() { stopping_.store(true); }
  bool stopping() const { return stopping_.load(); }
  // Blocks until no Attend call is in progress or `deadline` passes; true when none is.
  bool WaitForIdle(absl::Time deadline);
  int64_t active_calls() const;
  // Bytes of Q/K/V buffers held by calls in progress (uploading, queued or running).
  int64_t request_buffer_bytes() const { return request_memory_.in_use_bytes(); }
  // Bytes reserved against --max-upload-bytes by calls in progress.
  int64_t upload_reserved_bytes() const { return upload_budget_->held_bytes(); }
  // Streams the watchdog is watching (calls in progress).
  size_t watched_streams() const { return watchdog_->size(); }
  // Drops every region registration (server shutdown); requests still holding leases keep their
  // regions mapped until they end.
  void ReleaseRegions() { regions_->ReleaseAll(); }
  RegionRegistry& regions() { return *regions_; }
  // Drops every context (server shutdown; requests in flight keep theirs until they end).
  void ReleaseContexts() { contexts_->DeleteAll(); }
  ContextStore& contexts() { return *contexts_; }

  // What Describe returns.
  v1::DescribeResponse BuildDescribe() const;

 private:
  class AttendReactor;
  class AppendReactor;

  AttentionServiceImpl(const ServiceOptions& options, DevicePool* pool, Scheduler* scheduler,
                       Metrics* metrics, std::unique_ptr<ContextStore> contexts);
  // Security (grpc/auth.cc). The caller of a call, from its `authorization` metadata:
  // UNAUTHENTICATED when tokens are configured and it carries none, or a wrong one.
  absl::StatusOr<std::shared_ptr<auth::Principal>> Authorize(
      const grpc::CallbackServerContext& context) const;
  // Authorize, then one of the caller's max_concurrent_streams (held while `slot` lives).
  absl::StatusOr<std::shared_ptr<auth::Principal>> AdmitStream(
      const grpc::CallbackServerContext& context, auth::StreamSlot* slot) const;
  // Bytes `owner`'s contexts and shared-memory regions hold now.
  int64_t ResidentBytes(const std::string& owner);
  // The caller's max_request_bytes against what an Attend header brings (Q, and K and V unless
  // they come from a context), before the request assembler allocates anything.
  static absl::Status CheckAttendHeader(const auth::Principal& caller,
                                        const v1::AttendHeader& header);
  void CallStarted();
  void CallEnded();
  // "req-<run>-<n>": <run> is 8 hex digits drawn at random when the service starts, <n> counts
  // this run's requests from 1, so that ids stay unique across restarts.
  std::string NextRequestId();
  // On the watchdog thread after each round: malloc_trim once the last call has ended.
  void TrimIfIdle();

  ServiceOptions options_;
  DevicePool* const pool_;
  Scheduler* const scheduler_;
  Metrics* const metrics_;
  MemoryTracker request_memory_;
  std::unique_ptr<RegionRegistry> regions_;
  std::unique_ptr<ContextStore> contexts_;
  // The caller of every call when options_.authenticator is null (no limits of its own).
  const std::shared_ptr<auth::Principal> anonymous_ = std::make_shared<auth::Principal>("");
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};
  const std::string run_id_;
  std::atomic<uint64_t> next_id_{1};

  mutable std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  int64_t active_calls_ = 0;
  std::atomic<bool> trim_pending_{false};  // a call ended since the last malloc_trim

  std::unique_ptr<UploadBudget> upload_budget_;
  // Last: destroyed first, so its thread stops before anything it looks at goes away.
  std::unique_ptr<StreamWatchdog> watchdog_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_GRPC_SERVICE_H_
