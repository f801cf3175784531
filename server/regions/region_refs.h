// RegionRef (proto) -> leased byte ranges of registered regions, and the tensors read from or
// written to them. Used by the request assembler for AttendHeader's q/k/v/o/lse_region.
#ifndef ATTNSERVE_SERVER_REGIONS_REGION_REFS_H_
#define ATTNSERVE_SERVER_REGIONS_REGION_REFS_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attnserve.pb.h"
#include "core/tensor/tensor.h"
#include "server/regions/region_registry.h"

namespace attnserve {

// Bytes [offset, offset + bytes) of a leased region.
struct RegionSlice {
  RegionLease lease;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Checks `ref` for a tensor of `want_bytes` bytes (`tensor` describes it, "q [1, 2048, 8, 64]
// f32") and takes a lease on its region. INVALID_ARGUMENT naming `field` ("header.q_region") for
// an empty name, offset < 0 or not a multiple of 64, bytes != want_bytes, or a range past the
// region's end; the registry's NOT_FOUND / FAILED_PRECONDITION with the field prefixed; and
// FAILED_PRECONDITION when `registry` is null.
absl::StatusOr<RegionSlice> ResolveRegionRef(RegionRegistry* registry, const std::string& owner,
                                             const v1::RegionRef& ref, absl::string_view field,
                                             int64_t want_bytes, absl::string_view tensor);

// The tensor stored in `slice`: a view on host-mapped regions (the lease is its owner, so the
// region stays mapped while the tensor lives); on device regions a copy into `host_memory`
// (page-locked on GPU hosts) charged to `tracker`.
absl::StatusOr<HostTensor> TensorFromSlice(const RegionSlice& slice, DType dtype,
                                           std::vector<int64_t> dims, MemoryTracker* tracker,
                                           HostMemory* host_memory);

// Copies `t` (exactly slice.bytes bytes) into the slice: memcpy, or cudaMemcpy for CUDA IPC.
absl::Status WriteToSlice(const RegionSlice& slice, const HostTensor& t);

// INVALID_ARGUMENT naming both fields when header.o_region or header.lse_region shares a byte
// with another ref of the header in the same region (an output written over another output, or
// over an input the run still reads). Call after the refs were resolved: each range then lies
// inside its region, so the sums cannot overflow.
absl::Status CheckOutputRefsDisjoint(const v1::AttendHeader& header);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REGIONS_REGION_REFS_H_
