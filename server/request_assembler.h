// RequestAssembler: turns the request stream of one Attend call (a header, then tensor chunks)
// into validated host tensors Q, K, V. Runs on gRPC threads: every check is O(1) or O(log chunks)
// per message, and nothing is allocated until the header has been validated, so a header that
// claims 10^12 tokens is refused without touching memory.
#ifndef ATTNSERVE_SERVER_REQUEST_ASSEMBLER_H_
#define ATTNSERVE_SERVER_REQUEST_ASSEMBLER_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/attnserve.pb.h"
#include "core/engine/types.h"
#include "core/spec/attention_spec.h"
#include "core/tensor/tensor.h"
#include "server/contexts/context_store.h"
#include "server/regions/region_refs.h"
#include "server/stream_limits.h"

namespace attnserve {

// The longest header.request_id accepted (printable ASCII only; see CheckRequestId).
inline constexpr size_t kMaxRequestIdBytes = 128;

struct AssemblerOptions {
  int64_t max_request_bytes = int64_t{8} << 30;  // Q + K + V bytes of one request
  int64_t max_chunk_bytes = int64_t{64} << 20;   // largest accepted chunk payload
  // 4 MiB - 64 KiB: a chunk plus framing stays under gRPC clients' default 4 MiB receive limit.
  int64_t default_response_chunk_bytes = (int64_t{4} << 20) - (int64_t{64} << 10);
  // Charged with the Q/K/V buffers for their lifetime (request-buffer memory). Not owned; may be
  // null. Must outlive the assembler and the tensors taken from it.
  MemoryTracker* tracker = nullptr;
  // Where Q, K and V live: the devices' host memory (page-locked on a GPU host, so the copies to
  // the device run at the bus's rate). Not owned; null: plain memory.
  HostMemory* host_memory = nullptr;
  // Shared-memory regions named by AttendHeader's *_region refs. Not owned; null: refs are
  // refused (FAILED_PRECONDITION). `region_owner` is the caller's identity for the registry
  // (today the empty string: see server/regions/region_registry.h).
  RegionRegistry* regions = nullptr;
  std::string region_owner;
  // CUDA ordinals of this server's GPUs: a CUDA IPC region on one of them is read and written in
  // place (DeviceTensorViews in device_io(); the request then runs on that GPU). Regions on other
  // GPUs, and every region when this is empty, are copied through host memory.
  std::vector<int> in_place_cuda_ordinals;
  // Contexts named by AttendHeader.context (K and V read where the context keeps them). Not
  // owned; null: such headers are refused (FAILED_PRECONDITION). The owner is region_owner.
  ContextStore* contexts = nullptr;
  // Server-wide cap on request-buffer bytes (--max-upload-bytes): the header reserves what it
  // allocates, before allocating. Not owned; null: no cap.
  UploadBudget* upload_budget = nullptr;
  // Most entries the header's repeated fields may hold together (CSR row_ptr + col_idx, dilated
  // lists, sparse rates, cu_seqlens): checked with each field's own bound from the shape before
  // the spec is converted (--max-spec-entries).
  int64_t max_spec_entries = int64_t{1} << 22;
};

// Byte ranges [start, end) received so far for one tensor, merged as they touch. Insert is
// O(log n) in the number of disjoint ranges.
class ByteRangeSet {
 public:
  // Adds [start, end); returns false (and changes nothing) when it overlaps a range already held.
  // `overlap` then receives the first overlapping range.
  bool Insert(int64_t start, int64_t end, std::pair<int64_t, int64_t>* overlap);
  int64_t covered_bytes() const { return covered_; }
  size_t num_ranges() const { return ranges_.size(); }

 private:
  std::map<int64_t, int64_t> ranges_;  // start -> end, disjoint, non-adjacent
  int64_t covered_ = 0;
};

class RequestAssembler {
 public:
  explicit RequestAssembler(const AssemblerOptions& options);

  // Dispatches on the message: a header or a chunk. Errors are final for the call.
  absl::Status Add(const v1::AttendRequest& request);
  // INVALID_ARGUMENT "header: sent twice"; then validation (dtype set, dims >= 1, q_heads a
  // multiple of kv_heads, the spec), RESOURCE_EXHAUSTED when Q + K + V exceed max_request_bytes,
  // then the region refs (leases taken; a tensor with a ref counts as received, as a view of the
  // region's bytes) and the allocation of the others.
  absl::Status AddHeader(const v1::AttendHeader& header);
  // Copies a chunk into its tensor: "header: must be the first message" before the header; the
  // tensor must be Q, K or V; offset >= 0; the range inside the tensor and not overlapping any
  // range received before; payload <= max_chunk_bytes; the tensor has no region ref.
  absl::Status AddChunk(const v1::TensorChunk& chunk);

  bool has_header() const { return has_header_; }
  // True once every byte of Q, K and V has arrived.
  bool all_received() const;
  // OK when every byte arrived, else INVALID_ARGUMENT "v: received 1048576 of 2097152 bytes".
  absl::Status Complete() const;

  int64_t received_bytes() const { return received_bytes_; }
  int64_t total_bytes() const { return total_bytes_; }

  // Valid after a successful AddHeader.
  const v1::AttendHeader& header() const { return header_; }
  const AttentionSpec& spec() const { return spec_; }
  const AttentionShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t response_chunk_bytes() const { return response_chunk_bytes_; }

  // Drops the Q/K/V buffers not yet taken, the upload reservation and the holds (ReleaseHolds):
  // a call ended early, its memory goes back now, not when gRPC gets round to deleting the call.
  // The header stays.
  void ReleaseBuffers();
  // The job is done and its outputs written (WriteOutputs): returns the upload reservation and
  // drops the holds (ReleaseHolds), so that a caller who unregisters a region or deletes a
  // context right after the response finds it idle, not held until gRPC deletes the call.
  void JobDone() {
    reservation_.Release();
    ReleaseHolds();
  }
  // Drops what the assembler holds of regions and contexts: the output slices' leases and the
  // context view. outputs_in_regions() keeps its answer; WriteOutputs and OutputViews have
  // nothing left to write into afterwards.
  void ReleaseHolds();

  // Moves the tensors out (after Complete() is OK); the assembler holds nothing afterwards.
  HostTensor TakeQ() { return std::move(tensors_[0]); }
  HostTensor TakeK() { return std::move(tensors_[1]); }
  HostTensor TakeV() { return std::move(tensors_[2]); }

  // True when the header named o_region: the outputs go into regions, not onto the stream.
  bool outputs_in_regions() const { return outputs_in_regions_; }
  // Copies O (and LSE when the header named lse_region) into their regions. Thread-safe against
  // nothing else of the assembler's; call once the job is done.
  absl::Status WriteOutputs(const HostTensor& o, const HostTensor& lse) const;
  // Views of the output regions in host memory for a run to write into directly
  // (Device::RunInto): empty tensors unless every output region is written directly (host
  // memory, or device memory read in place: see device_io()); then WriteOutputs has nothing left
  // to do for a single-device run that used them.
  absl::StatusOr<AttentionOutputs> OutputViews() const;
  // The tensors read or written in place in one GPU's memory (CUDA IPC regions on a GPU of this
  // server): the inputs found here are not in TakeQ/K/V. Moves them out, like TakeQ.
  DeviceIo TakeDeviceIo() { return std::move(device_io_); }
  // The key shards of an attend against a context split over devices (empty otherwise): the
  // request's K and V, which TakeK/TakeV then leave empty. Moves them out, like TakeQ.
  std::vector<KeyShard> TakeKeyShards() { return std::move(key_shards_); }

 private:
  // The region refs of a validated header: q/k/v tensors taken from regions (the others are
  // allocated) and the output slices.
  absl::Status ResolveTensors(const v1::AttendHeader& header, const AttentionShape& shape,
                              DType dtype, std::array<HostTensor, 3>* tensors,
                              std::array<bool, 3>* from_region);
  absl::Status ResolveOutputs(const v1::AttendHeader& header, const AttentionShape& shape,
                              DType dtype);
  // header.context: a view of the context (kept in context_) after checking the header against
  // it (batch 1, dtype, kv_heads, head_dim, no k/v refs, kv_tokens 0 or its length).
  absl::Status ResolveContext(const v1::AttendHeader& header, DType dtype);
  // K and V of the context as the request's tensors: host views, or device views in device_io_,
  // or (a context split over devices) one KeyShard per shard in key_shards_.
  absl::Status ContextTensors(const AttentionShape& shape, std::array<HostTensor, 3>* tensors);
  // A context split over devices: the header's placement hint and spec are ones it can run.
  absl::Status CheckShardedAttend(const v1::AttendHeader& header, const AttentionSpec& spec) const;
  // A view of `slice` for a run to read or write in place, when its region is device memory on
  // a GPU in options_.in_place_cuda_ordinals (and on the GPU of any earlier view); else empty.
  DeviceTensorView InPlaceView(const RegionSlice& slice, DType dtype,
                               const std::vector<int64_t>& dims);

  const AssemblerOptions options_;
  bool has_header_ = false;
  v1::AttendHeader header_;
  AttentionSpec spec_;
  AttentionShape shape_;
  DType dtype_ = DType::kF32;
  int64_t response_chunk_bytes_ = 0;
  std::array<HostTensor, 3> tensors_;  // q, k, v
  std::array<int64_t, 3> tensor_bytes_{};
  std::array<ByteRangeSet, 3> received_;
  std::array<bool, 3> from_region_{};
  std::optional<RegionSlice> o_slice_;
  std::optional<RegionSlice> lse_slice_;
  bool outputs_in_regions_ = false;  // the header named o_region (kept after ReleaseHolds)
  // Set by the header: in-place views, the GPU they are on (-1: none), and whether every output
  // slice is written directly by the run (host-mapped, or a view in device_io_).
  DeviceIo device_io_;
  std::optional<ContextView> context_;
  std::vector<KeyShard> key_shards_;
  int in_place_ordinal_ = -1;
  bool outputs_direct_ = false;
  int64_t received_bytes_ = 0;
  int64_t total_bytes_ = 0;
  UploadBudget::Reservation reservation_;
};

// The size rules of a header's repeated fields, checked on the proto before anything is copied
// out of it: each field against what the shape allows (CSR row_ptr: exactly ceil(tokens /
// block_size) + 1 entries; col_idx: at most one per (query block, key block) pair; cu_seqlens: at
// most tokens + 1; dilated lists and sparse rates: at most one per key block / position), and all
// of them together against `max_entries`. INVALID_ARGUMENT for a field the shape rules out,
// RESOURCE_EXHAUSTED for one over `max_entries` (--max-spec-entries), each naming the field.
absl::Status CheckHeaderSizes(const v1::AttendHeader& header, int64_t kv_len, int64_t max_entries);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_REQUEST_ASSEMBLER_H_
