#include "bench/e2e/context_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace bench {
namespace {

namespace v1 = ::attnserve::v1;

template <typename Writer, typename Message>
void WriteChunks(Writer& w, Message& m, v1::TensorKind kind, const std::string& bytes) {
  for (size_t off = 0; off < bytes.size(); off += kContextChunkBytes) {
    m.Clear();
    v1::TensorChunk* c = m.mutable_chunk();
    c->set_tensor(kind);
    c->set_offset(static_cast<int64_t>(off));
    c->set_data(bytes.substr(off, std::min<size_t>(kContextChunkBytes, bytes.size() - off)));
    w->Write(m);
  }
}

// Places a response chunk at its offset in `out` (grown as needed).
void Place(const v1::TensorChunk& c, std::string* out) {
  if (out == nullptr) return;
  const size_t end = static_cast<size_t>(c.offset()) + c.data().size();
  if (out->size() < end) out->resize(end);
  std::memcpy(out->data() + c.offset(), c.data().data(), c.data().size());
}

}  // namespace

std::string RandomBf16(int64_t elems, uint64_t seed) {
  // splitmix64: fast enough for gigabytes of context rows, four values per draw.
  std::string out(static_cast<size_t>(elems * 2), '\0');
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < elems; i += 4) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int64_t j = 0; j < 4 && i + j < elems; ++j) {
      // 16 random bits -> a float in [-1, 1) -> its upper half (bf16, truncated).
      const float f = static_cast<float>((z >> (16 * j)) & 0xFFFF) / 32768.f - 1.f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&out[static_cast<size_t>((i + j) * 2)], &h, 2);
    }
  }
  return out;
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::Status AppendRows(v1::AttentionService::Stub& stub, const std::string& name, int64_t rows,
                        const std::string& k, const std::string& v) {
  grpc::ClientContext ctx;
  v1::AppendContextResponse resp;
  auto w = stub.AppendContext(&ctx, &resp);
  v1::AppendContextRequest m;
  m.mutable_header()->set_context(name);
  m.mutable_header()->set_tokens(rows);
  w->Write(m);
  WriteChunks(w, m, v1::TENSOR_K, k);
  WriteChunks(w, m, v1::TENSOR_V, v);
  w->WritesDone();
  return FromGrpc(w->Finish(), "AppendContext");
}

absl::StatusOr<CallFigures> TimedAttend(v1::AttentionService::Stub& stub, const v1::AttendHeader& h,
                                        const std::string& q, const std::string* k,
                                        const std::string* v, std::string* o, std::string* lse) {
  const absl::Time t0 = absl::Now();
  grpc::ClientContext ctx;
  auto s = stub.Attend(&ctx);
  v1::AttendRequest m;
  *m.mutable_header() = h;
  s->Write(m);
  WriteChunks(s, m, v1::TENSOR_Q, q);
  if (k != nullptr) WriteChunks(s, m, v1::TENSOR_K, *k);
  if (v != nullptr) WriteChunks(s, m, v1::TENSOR_V, *v);
  s->WritesDone();
  v1::AttendResponse r;
  CallFigures f;
  while (s->Read(&r)) {
    if (r.has_header()) {
      f.kernel_s = r.header().kernel_seconds();
      f.compute_s = r.header().compute_seconds();
      f.receive_s = r.header().receive_seconds();
      f.queue_s = r.header().queue_seconds();
      f.devices.assign(r.header().devices().begin(), r.header().devices().end());
    } else if (r.has_chunk()) {
      Place(r.chunk(), r.chunk().tensor() == v1::TENSOR_LSE ? lse : o);
    }
  }
  ATTN_RETURN_IF_ERROR(FromGrpc(s->Finish(), "Attend"));
  f.wall_s = absl::ToDoubleSeconds(absl::Now() - t0);
  return f;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
}  // namespace attnserve
