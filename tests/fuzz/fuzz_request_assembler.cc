// Fuzz target: the request assembler (server/request_assembler.*), which turns one Attend
// stream (a header, then Q/K/V chunks) into tensors on gRPC threads. Two input forms, by the
// first byte:
//   even: a structured stream from FuzzedDataProvider: a header (dims, dtype, spec, offsets,
//         packed sequences, placement, region/context refs, response chunk size) and up to
//         kMaxMessages chunks, each aimed at the next missing bytes of a tensor or anywhere;
//   odd:  a list of serialized AttendRequest protos, each prefixed by a 2-byte little-endian
//         length (what a client could put on the wire).
// The assembler runs with a 1 MiB request limit and a registry holding one 1 MiB shared-memory
// region "r", which headers may name for any of q, k, v, o, lse. Checked: errors are final and carry a message;
// an accepted chunk never overlaps bytes received before and a refused one says why; what
// Complete() accepts is byte for byte what the chunks (or the region) carried; the memory tracker is back at 0
// once the assembler and its tensors are gone.
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/attnserve.pb.h"
#include "server/regions/region_registry.h"
#include "server/request_assembler.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_spec_gen.h"
#include "wire/convert.h"

namespace attnserve {
namespace {

constexpr int64_t kMaxRequestBytes = int64_t{1} << 20;
constexpr int64_t kMaxChunkBytes = int64_t{1} << 14;
constexpr int kMaxMessages = 256;

constexpr int64_t kRegionBytes = int64_t{1} << 20;

void FillRegion(std::byte* region) {
  for (int64_t i = 0; i < kRegionBytes; ++i) region[i] = static_cast<std::byte>((i * 131) >> 3);
}

// The registry with region "r" (a POSIX shm object of kRegionBytes, filled with a pattern), made
// once per process; the object is unlinked at once, the mapping stays.
RegionRegistry* Regions() {
  static RegionRegistry* registry = [] {
    const std::string key = "/attnserve_fuzz_assembler_" + std::to_string(::getpid());
    const int fd = ::shm_open(key.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    FUZZ_CHECK(fd >= 0 && ::ftruncate(fd, kRegionBytes) == 0, "shm_open ", key);
    ::close(fd);
    RegionRegistry* r = MakeRegionRegistry(RegionRegistryOptions{}).release();
    absl::StatusOr<RegionInfo> info = r->RegisterSystem("", "r", key, 0, kRegionBytes);
    ::shm_unlink(key.c_str());
    FUZZ_CHECK(info.ok(), info.status().ToString());
    absl::StatusOr<RegionLease> lease = r->Acquire("", "r");
    FUZZ_CHECK(lease.ok());
    FillRegion((*lease)->host_data());
    return r;
  }();
  return registry;
}

int64_t SatMul(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_mul_overflow(a, b, &out) ? std::numeric_limits<int64_t>::max() : out;
}

// The byte sizes of q, k, v, o, lse a header implies (saturating; garbage for invalid headers,
// which is what a careless client would send too).
std::array<int64_t, 5> ImpliedBytes(const v1::AttendHeader& h) {
  const int64_t elem = h.dtype() == v1::DTYPE_F32 ? 4 : 2;
  const int64_t kv_len = h.kv_tokens() > 0 ? h.kv_tokens() : h.tokens();
  const int64_t q = SatMul(SatMul(SatMul(SatMul(h.batch(), h.tokens()), h.q_heads()), h.head_dim()), elem);
  const int64_t kv = SatMul(SatMul(SatMul(SatMul(h.batch(), kv_len), h.kv_heads()), h.head_dim()), elem);
  const int64_t lse = SatMul(SatMul(SatMul(h.batch(), h.q_heads()), h.tokens()), 4);
  return {q, kv, kv, q, lse};
}

// What the fuzzer sent, to compare the assembled tensors against.
struct Shadow {
  std::array<std::string, 3> bytes;        // q, k, v as sent (or as the region holds them)
  std::array<std::vector<bool>, 3> seen;  // which bytes were accepted
  std::array<bool, 3> from_region{};
  bool active = false;
};

int Index(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_Q:
      return 0;
    case v1::TENSOR_K:
      return 1;
    case v1::TENSOR_V:
      return 2;
    default:
      return -1;
  }
}

v1::AttendHeader FuzzHeader(FuzzedDataProvider& p) {
  v1::AttendHeader h;
  h.set_request_id(p.ConsumeRandomLengthString(16));
  h.set_dtype(static_cast<v1::DType>(p.ConsumeIntegralInRange<int>(-1, 4)));
  const auto dim = [&](int64_t small) {
    return p.ConsumeIntegralInRange<int>(0, 15) == 0 ? fuzz::FuzzInt(p, small)
                                                     : p.ConsumeIntegralInRange<int64_t>(1, small);
  };
  h.set_batch(dim(2));
  h.set_tokens(dim(64));
  h.set_kv_heads(dim(2));
  const bool grouped = h.kv_heads() >= 1 && h.kv_heads() <= 8 && p.ConsumeBool();
  h.set_q_heads(grouped ? h.kv_heads() * p.ConsumeIntegralInRange<int64_t>(1, 3) : dim(4));
  h.set_head_dim(dim(16));
  if (p.ConsumeBool()) h.set_kv_tokens(dim(96));
  if (p.ConsumeBool()) {
    const int64_t kv = std::clamp<int64_t>(h.kv_tokens(), 0, 1 << 20);
    const int64_t n = std::clamp<int64_t>(h.tokens(), 0, 1 << 20);
    h.set_q_offset(p.ConsumeBool() ? std::max<int64_t>(0, kv - n) : fuzz::FuzzInt(p, 96));
  }
  if (p.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const int parts = p.ConsumeIntegralInRange<int>(1, 4);
    for (int64_t x : fuzz::FuzzCuSeqlens(p, parts, h.tokens())) h.add_cu_seqlens_q(x);
    for (int64_t x : fuzz::FuzzCuSeqlens(p, parts, h.kv_tokens() > 0 ? h.kv_tokens() : h.tokens())) {
      h.add_cu_seqlens_k(x);
    }
  }
  if (p.ConsumeIntegralInRange<int>(0, 15) != 0) {
    AttentionSpec spec;
    spec.pattern = fuzz::FuzzPattern(p, 160);
    spec.causal = p.ConsumeBool();
    spec.scale = fuzz::FuzzScale(p);
    *h.mutable_spec() = SpecToProto(spec);
  }
  h.set_placement(static_cast<v1::Placement>(p.ConsumeIntegralInRange<int>(-1, 6)));
  h.set_return_lse(p.ConsumeBool());
  if (p.ConsumeBool()) h.set_response_chunk_bytes(fuzz::FuzzInt(p, kMaxChunkBytes * 2));
  if (p.ConsumeIntegralInRange<int>(0, 31) == 0) {
    h.set_context(p.ConsumeRandomLengthString(8));  // no store: refused
  }
  // Region refs: mostly region "r" at a 64-byte multiple with the tensor's exact size.
  if (p.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const std::array<int64_t, 5> sizes = ImpliedBytes(h);
    for (int i = 0; i < 5; ++i) {
      if (!p.ConsumeBool()) continue;
      v1::RegionRef* ref = i == 0   ? h.mutable_q_region()
                           : i == 1 ? h.mutable_k_region()
                           : i == 2 ? h.mutable_v_region()
                           : i == 3 ? h.mutable_o_region()
                                    : h.mutable_lse_region();
      const int name = p.ConsumeIntegralInRange<int>(0, 15);
      ref->set_region(name == 0 ? "x" : name == 1 ? "" : "r");
      ref->set_offset(p.ConsumeIntegralInRange<int>(0, 15) == 0
                          ? fuzz::FuzzInt(p, kRegionBytes)
                          : 64 * p.ConsumeIntegralInRange<int64_t>(0, kRegionBytes / 64));
      ref->set_bytes(p.ConsumeIntegralInRange<int>(0, 15) == 0 ? fuzz::FuzzInt(p, 4096)
                                                               : sizes[i]);
    }
  }
  return h;
}

v1::AttendRequest FuzzChunk(FuzzedDataProvider& p, const RequestAssembler& a,
                            const Shadow& shadow) {
  v1::AttendRequest r;
  if (p.ConsumeIntegralInRange<int>(0, 63) == 0) return r;  // neither header nor chunk
  if (p.ConsumeIntegralInRange<int>(0, 63) == 0) {
    *r.mutable_header() = FuzzHeader(p);  // a second header
    return r;
  }
  v1::TensorChunk* c = r.mutable_chunk();
  const int kind = p.ConsumeIntegralInRange<int>(0, 15);
  c->set_tensor(kind < 12 ? static_cast<v1::TensorKind>(v1::TENSOR_Q + kind % 3)
                          : static_cast<v1::TensorKind>(p.ConsumeIntegralInRange<int>(-1, 8)));
  const int t = Index(c->tensor());
  int64_t offset = 0;
  if (t >= 0 && shadow.active && p.ConsumeIntegralInRange<int>(0, 3) != 0) {
    // The first byte not received yet: valid streams make progress.
    const std::vector<bool>& seen = shadow.seen[t];
    offset = std::find(seen.begin(), seen.end(), false) - seen.begin();
  } else {
    offset = fuzz::FuzzInt(p, std::max<int64_t>(a.total_bytes(), 64));
  }
  c->set_offset(offset);
  const size_t len = p.ConsumeIntegralInRange<size_t>(0, kMaxChunkBytes + 1);
  std::string data = p.ConsumeBytesAsString(len);
  // Stretch short payloads so a few fuzz bytes can fill a tensor.
  if (data.size() < len && p.ConsumeBool()) data.resize(len, data.empty() ? 'x' : data.back());
  c->set_data(std::move(data));
  return r;
}

// 2-byte little-endian length, then that many bytes of a serialized AttendRequest; repeated.
std::vector<v1::AttendRequest> ParseFramed(const uint8_t* data, size_t size) {
  std::vector<v1::AttendRequest> out;
  size_t pos = 0;
  while (pos + 2 <= size && out.size() < kMaxMessages) {
    const size_t len = std::min<size_t>(data[pos] | (size_t{data[pos + 1]} << 8), size - pos - 2);
    v1::AttendRequest r;
    // A message that does not parse would fail the call in gRPC, before the assembler.
    if (r.ParseFromArray(data + pos + 2, static_cast<int>(len))) out.push_back(std::move(r));
    pos += 2 + len;
  }
  return out;
}

// Feeds one message and checks what the assembler says about it against the shadow.
// Returns false once the stream has failed (errors are final).
bool Feed(RequestAssembler& a, const v1::AttendRequest& r, Shadow& shadow) {
  const int64_t received_before = a.received_bytes();
  const absl::Status s = a.Add(r);
  // FUZZ_VERBOSE=1: print why each stream ended (to check that seeds go where they should).
  static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s\n", r.has_header() ? "header" : "chunk", s.ToString().c_str());
  if (!s.ok()) {
    FUZZ_CHECK(!s.message().empty(), "an error without a message");
    FUZZ_CHECK(s.code() != absl::StatusCode::kOk && s.code() != absl::StatusCode::kUnknown &&
                   s.code() != absl::StatusCode::kInternal,
               s.ToString());
    FUZZ_CHECK(a.received_bytes() == received_before, "a refused message changed the count");
    if (r.has_chunk() && shadow.active) {
      const int t = Index(r.chunk().tensor());
      const int64_t off = r.chunk().offset();
      const int64_t len = static_cast<int64_t>(r.chunk().data().size());
      // A chunk inside its tensor, within the size limit, is refused only for an overlap.
      if (t >= 0 && !shadow.from_region[t] && off >= 0 && len <= kMaxChunkBytes &&
          off <= static_cast<int64_t>(shadow.seen[t].size()) - len) {
        const auto begin = shadow.seen[t].begin() + off;
        FUZZ_CHECK(std::find(begin, begin + len, true) != begin + len,
                   "a chunk of fresh bytes in range was refused: ", s.ToString());
      }
    }
    return false;
  }
  if (r.has_header()) {
    FUZZ_CHECK(!shadow.active, "a second header was accepted");
    FUZZ_CHECK(a.has_header() && a.total_bytes() <= 3 * kMaxRequestBytes);
    const AttentionShape& sh = a.shape();
    const int64_t elem = DTypeSize(a.dtype());
    const int64_t q = sh.batch * sh.tokens * sh.q_heads * sh.head_dim * elem;
    const int64_t kv = sh.batch * sh.kv_len() * sh.kv_heads * sh.head_dim * elem;
    FUZZ_CHECK(q + 2 * kv == a.total_bytes(), "total_bytes ", a.total_bytes(), " for q ", q,
               " and k, v ", kv);
    FUZZ_CHECK(q + 2 * kv <= kMaxRequestBytes);
    FUZZ_CHECK(ValidateSpec(a.spec(), sh).ok(), "the header's spec is not valid");
    FUZZ_CHECK(a.response_chunk_bytes() >= 1);
    const int64_t sizes[3] = {q, kv, kv};
    const v1::AttendHeader& h = r.header();
    const v1::RegionRef* refs[3] = {&h.q_region(), &h.k_region(), &h.v_region()};
    const bool has_ref[3] = {h.has_q_region(), h.has_k_region(), h.has_v_region()};
    for (int i = 0; i < 3; ++i) {
      shadow.bytes[i].assign(sizes[i], '\0');
      shadow.seen[i].assign(sizes[i], has_ref[i]);
      shadow.from_region[i] = has_ref[i];
      if (!has_ref[i]) continue;
      FUZZ_CHECK(refs[i]->region() == "r" && refs[i]->offset() + sizes[i] <= kRegionBytes,
                 "a region ref past the region was accepted");
      absl::StatusOr<RegionLease> lease = Regions()->Acquire("", "r");
      std::memcpy(shadow.bytes[i].data(), (*lease)->host_data() + refs[i]->offset(), sizes[i]);
    }
    FUZZ_CHECK(a.received_bytes() == (has_ref[0] ? q : 0) + (has_ref[1] ? kv : 0) +
                                         (has_ref[2] ? kv : 0));
    shadow.active = true;
    return true;
  }
  FUZZ_CHECK(shadow.active, "a chunk was accepted before the header");
  const int t = Index(r.chunk().tensor());
  FUZZ_CHECK(t >= 0);
  const int64_t off = r.chunk().offset();
  const std::string& data = r.chunk().data();
  FUZZ_CHECK(off >= 0 && off + static_cast<int64_t>(data.size()) <=
                             static_cast<int64_t>(shadow.seen[t].size()));
  for (size_t i = 0; i < data.size(); ++i) {
    FUZZ_CHECK(!shadow.seen[t][off + i], "byte ", off + i, " of tensor ", t, " accepted twice");
    shadow.seen[t][off + i] = true;
  }
  std::memcpy(shadow.bytes[t].data() + off, data.data(), data.size());
  FUZZ_CHECK(a.received_bytes() == received_before + static_cast<int64_t>(data.size()));
  return true;
}

// The header named o_region (and maybe lse_region): the views and WriteOutputs land exactly
// there. The region's pattern is restored afterwards, so that every input sees the same region.
void CheckOutputRegions(const RequestAssembler& a) {
  const AttentionShape& sh = a.shape();
  HostTensor o = *HostTensor::Create(a.dtype(), {sh.batch, sh.tokens, sh.q_heads, sh.head_dim});
  HostTensor lse = *HostTensor::Create(DType::kF32, {sh.batch, sh.q_heads, sh.tokens});
  std::memset(o.data(), 0x5a, o.nbytes());
  std::memset(lse.data(), 0x3c, lse.nbytes());
  absl::StatusOr<AttentionOutputs> views = a.OutputViews();
  FUZZ_CHECK(views.ok(), views.status().ToString());
  const absl::Status written = a.WriteOutputs(o, lse);
  FUZZ_CHECK(written.ok(), written.ToString());
  std::byte* region = (*Regions()->Acquire("", "r"))->host_data();
  const v1::AttendHeader& h = a.header();
  const std::pair<const v1::RegionRef*, const HostTensor*> outs[2] = {
      {h.has_o_region() ? &h.o_region() : nullptr, &o},
      {h.has_lse_region() ? &h.lse_region() : nullptr, &lse}};
  for (const auto& [ref, t] : outs) {
    if (ref == nullptr) continue;
    FUZZ_CHECK(ref->bytes() == t->nbytes() && ref->offset() + ref->bytes() <= kRegionBytes);
    FUZZ_CHECK(std::memcmp(region + ref->offset(), t->data(), t->nbytes()) == 0,
               "WriteOutputs did not write the region slice [", ref->offset(), ", +",
               ref->bytes(), "); o_region at ", h.o_region().offset(), ", lse_region at ",
               h.lse_region().offset(), " (+", h.lse_region().bytes(), ")");
  }
  FillRegion(region);
}

// One stream; the tensors it assembled are gone when it returns.
void RunStream(const uint8_t* data, size_t size, bool framed, MemoryTracker& tracker) {
  FuzzedDataProvider p(data, size);
  {
    AssemblerOptions options;
    options.max_request_bytes = kMaxRequestBytes;
    options.max_chunk_bytes = kMaxChunkBytes;
    options.tracker = &tracker;
    options.regions = Regions();
    RequestAssembler a(options);
    Shadow shadow;
    std::vector<v1::AttendRequest> stream;
    if (framed) stream = ParseFramed(data, size);
    bool ok = true;
    if (framed) {
      for (const v1::AttendRequest& r : stream) {
        if (!(ok = Feed(a, r, shadow))) break;
      }
    } else {
      v1::AttendRequest first;
      if (p.ConsumeIntegralInRange<int>(0, 31) == 0) {
        first = FuzzChunk(p, a, shadow);  // a chunk before any header
      } else {
        *first.mutable_header() = FuzzHeader(p);
      }
      ok = Feed(a, first, shadow);
      for (int i = 0; ok && i < kMaxMessages && p.remaining_bytes() > 0; ++i) {
        ok = Feed(a, FuzzChunk(p, a, shadow), shadow);
      }
    }
    if (!shadow.active) return;
    const bool complete = std::all_of(shadow.seen.begin(), shadow.seen.end(), [](const auto& s) {
      return std::find(s.begin(), s.end(), false) == s.end();
    });
    FUZZ_CHECK(a.all_received() == complete);
    FUZZ_CHECK(a.Complete().ok() == complete, a.Complete().ToString());
    if (!complete) {
      FUZZ_CHECK(a.Complete().code() == absl::StatusCode::kInvalidArgument);
      return;
    }
    const HostTensor tensors[3] = {a.TakeQ(), a.TakeK(), a.TakeV()};
    for (int i = 0; i < 3; ++i) {
      FUZZ_CHECK(tensors[i].nbytes() == static_cast<int64_t>(shadow.bytes[i].size()));
      FUZZ_CHECK(std::memcmp(tensors[i].data(), shadow.bytes[i].data(), shadow.bytes[i].size()) ==
                     0,
                 "tensor ", i, " differs from the bytes sent");
    }
    if (a.outputs_in_regions()) CheckOutputRegions(a);
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 1) return;
  MemoryTracker tracker;
  RunStream(data + 1, size - 1, (data[0] & 1) != 0, tracker);
  FUZZ_CHECK(tracker.in_use_bytes() == 0, tracker.in_use_bytes(), " tracked bytes leaked");
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::FuzzOne(data, size);
  return 0;
}
