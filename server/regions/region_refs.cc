#include "server/regions/region_refs.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::StatusOr<RegionSlice> ResolveRegionRef(RegionRegistry* registry, const std::string& owner,
                                             const v1::RegionRef& ref, absl::string_view field,
                                             int64_t want_bytes, absl::string_view tensor) {
  if (ref.region().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".region: must name a registered region"));
  }
  if (ref.offset() < 0 || ref.offset() % static_cast<int64_t>(kHostTensorAlignment) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": offset ", ref.offset(), " must be >= 0 and a multiple of ",
                     kHostTensorAlignment));
  }
  if (ref.bytes() != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": bytes ", ref.bytes(), " != ",
                                                   want_bytes, ", the size of ", tensor));
  }
  if (registry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": this server does not take shared-memory regions"));
  }
  absl::StatusOr<RegionLease> lease = registry->Acquire(owner, ref.region());
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(field, ": ", lease.status().message()));
  }
  const int64_t size = (*lease)->bytes();
  if (ref.offset() > size || ref.bytes() > size - ref.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": offset ", ref.offset(), " + ",
                                                   ref.bytes(), " bytes exceeds region '",
                                                   ref.region(), "' of ", size, " bytes"));
  }
  return RegionSlice{*std::move(lease), ref.offset(), ref.bytes()};
}

absl::StatusOr<HostTensor> TensorFromSlice(const RegionSlice& slice, DType dtype,
                                           std::vector<int64_t> dims, MemoryTracker* tracker,
                                           HostMemory* host_memory) {
  Region& region = *slice.lease;
  if (std::byte* base = region.host_data(); base != nullptr) {
    return HostTensor::Wrap(dtype, std::move(dims), base + slice.offset,
                            static_cast<size_t>(slice.bytes), slice.lease);
  }
  absl::StatusOr<HostTensor> t = HostTensor::Create(dtype, std::move(dims), tracker, host_memory);
  if (!t.ok()) return t.status();
  if (absl::Status s = region.CopyOut(slice.offset, t->data(), slice.bytes); !s.ok()) return s;
  return t;
}

absl::Status WriteToSlice(const RegionSlice& slice, const HostTensor& t) {
  if (static_cast<int64_t>(t.nbytes()) != slice.bytes) {
    return absl::InternalError(absl::StrCat("region ", slice.lease->name(), ": output of ",
                                            t.nbytes(), " bytes for a slice of ", slice.bytes));
  }
  return slice.lease->CopyIn(slice.offset, t.data(), slice.bytes);
}

absl::Status CheckOutputRefsDisjoint(const v1::AttendHeader& h) {
  const std::pair<const char*, const v1::RegionRef*> refs[5] = {
      {"o_region", h.has_o_region() ? &h.o_region() : nullptr},
      {"lse_region", h.has_lse_region() ? &h.lse_region() : nullptr},
      {"q_region", h.has_q_region() ? &h.q_region() : nullptr},
      {"k_region", h.has_k_region() ? &h.k_region() : nullptr},
      {"v_region", h.has_v_region() ? &h.v_region() : nullptr}};
  for (int out = 0; out < 2; ++out) {
    const v1::RegionRef* a = refs[out].second;
    if (a == nullptr) continue;
    for (int other = out + 1; other < 5; ++other) {
      const v1::RegionRef* b = refs[other].second;
      if (b == nullptr || b->region() != a->region() || a->bytes() == 0 || b->bytes() == 0 ||
          a->offset() >= b->offset() + b->bytes() || b->offset() >= a->offset() + a->bytes()) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "header.", refs[out].first, ": bytes [", a->offset(), ", ", a->offset() + a->bytes(),
          ") of region '", a->region(), "' overlap header.", refs[other].first, "'s [",
          b->offset(), ", ", b->offset() + b->bytes(), "); outputs need bytes of their own"));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve
