// RegisterRegion, UnregisterRegion, ListRegions: unary calls over the service's RegionRegistry
// (server/regions/). A region belongs to the principal that registered it (the anonymous "" without
// a token file): another principal's calls do not find it (NOT_FOUND).
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/util/log_safe.h"
#include "server/grpc/service.h"
#include "spdlog/spdlog.h"
#include "wire/status.h"

namespace attnserve {
namespace {

void ToProto(const RegionInfo& info, v1::RegionStatus* out) {
  out->set_name(info.name);
  out->set_kind(std::string(RegionKindName(info.kind)));
  out->set_bytes(info.bytes);
  out->set_shm_key(info.shm_key);
  out->set_offset(info.offset);
  out->set_device(info.device);
  out->set_leases(info.leases);
  out->set_closing(info.closing);
  out->set_page_locked(info.page_locked);
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AttentionServiceImpl::RegisterRegion(
    grpc::CallbackServerContext* context, const v1::RegisterRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  const std::string& owner = (*caller)->name();
  // The caller's max_resident_bytes: registered, then counted, and unregistered again when over,
  // under the caller's resident lock.
  std::unique_lock<std::mutex> resident((*caller)->resident_mu(), std::defer_lock);
  int64_t held = 0;
  if ((*caller)->limits().max_resident_bytes > 0) {
    resident.lock();
    held = ResidentBytes(owner);
  }
  absl::StatusOr<RegionInfo> info;
  switch (request->kind_case()) {
    case v1::RegisterRegionRequest::kSystem: {
      const v1::SystemRegion& r = request->system();
      info = regions_->RegisterSystem(owner, request->name(), r.shm_key(), r.offset(), r.bytes());
      break;
    }
    case v1::RegisterRegionRequest::kCudaIpc: {
      const v1::CudaIpcRegion& r = request->cuda_ipc();
      info = regions_->RegisterCudaIpc(owner, request->name(), r.handle(), r.device(), r.bytes());
      break;
    }
    case v1::RegisterRegionRequest::KIND_NOT_SET:
      info = absl::InvalidArgumentError("kind: one of system, cuda_ipc must be set");
      break;
  }
  if (info.ok() && resident.owns_lock()) {
    if (absl::Status s = (*caller)->CheckResident(held, info->bytes, "register region"); !s.ok()) {
      (void)regions_->Unregister(owner, info->name);
      info = s;
    }
  }
  if (!info.ok()) {
    spdlog::warn("register region {}: {}", LogValue(request->name(), 128),
                 SanitizeForLog(info.status().ToString(), 1024));
    return FinishWith(context, info.status());
  }
  spdlog::info("register region {}: {} {} bytes{}", LogValue(info->name, 128),
               std::string(RegionKindName(info->kind)), info->bytes,
               info->shm_key.empty() ? "" : absl::StrCat(" at ", LogValue(info->shm_key, 256)));
  ToProto(*info, response->mutable_region());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  absl::StatusOr<UnregisterOutcome> out = regions_->Unregister((*caller)->name(), request->name());
  if (!out.ok()) return FinishWith(context, out.status());
  spdlog::info("unregister region {}{}", LogValue(request->name(), 128),
               out->in_use ? absl::StrCat(": ", out->leases, " request(s) still use it") : "");
  response->set_in_use(out->in_use);
  response->set_leases(out->leases);
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionServiceImpl::ListRegions(
    grpc::CallbackServerContext* context, const v1::ListRegionsRequest* /*request*/,
    v1::ListRegionsResponse* response) {
  absl::StatusOr<std::shared_ptr<auth::Principal>> caller = Authorize(*context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  for (const RegionInfo& info : regions_->List((*caller)->name())) {
    ToProto(info, response->add_regions());
  }
  return FinishWith(context, absl::OkStatus());
}

}  // namespace attnserve
