#include "tests/integration/attend_streams.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

v1::AttendHeader GoodHeader() {
  v1::AttendHeader h;
  h.set_request_id("bad-request-test");
  h.set_dtype(v1::DTYPE_F32);
  h.set_batch(1);
  h.set_tokens(kTokens);
  h.set_q_heads(kQHeads);
  h.set_kv_heads(kKvHeads);
  h.set_head_dim(kHeadDim);
  h.mutable_spec()->mutable_dense();
  h.set_return_lse(true);
  return h;
}

v1::AttendRequest HeaderMsg(const v1::AttendHeader& h) {
  v1::AttendRequest r;
  *r.mutable_header() = h;
  return r;
}

// `size` bytes of well-formed f32 values (so the data itself is never the problem).
std::string Payload(int64_t size, uint64_t seed) {
  std::string out(static_cast<size_t>(size), '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i + 4 <= size; i += 4) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    // A float in [1, 2): exponent 127, random mantissa.
    const uint32_t bits = 0x3f800000u | static_cast<uint32_t>((x >> 41) & 0x7fffffu);
    std::memcpy(out.data() + i, &bits, 4);
  }
  return out;
}

v1::AttendRequest ChunkMsg(v1::TensorKind kind, int64_t offset, int64_t size) {
  v1::AttendRequest r;
  r.mutable_chunk()->set_tensor(kind);
  r.mutable_chunk()->set_offset(offset);
  r.mutable_chunk()->set_data(Payload(size, static_cast<uint64_t>(offset) + kind));
  return r;
}

// Every byte of Q, K and V for `h` (sizes from its dims, f32), in chunks of `chunk` bytes.
std::vector<v1::AttendRequest> AllChunks(const v1::AttendHeader& h, int64_t chunk) {
  const int64_t rows = h.batch() * h.tokens() * h.head_dim() * 4;
  const std::pair<v1::TensorKind, int64_t> tensors[] = {{v1::TENSOR_Q, rows * h.q_heads()},
                                                        {v1::TENSOR_K, rows * h.kv_heads()},
                                                        {v1::TENSOR_V, rows * h.kv_heads()}};
  std::vector<v1::AttendRequest> out;
  for (const auto& [kind, total] : tensors) {
    for (int64_t off = 0; off < total; off += chunk) {
      out.push_back(ChunkMsg(kind, off, std::min(chunk, total - off)));
    }
  }
  return out;
}

// A header plus all chunks of it.
std::vector<v1::AttendRequest> FullRequest(const v1::AttendHeader& h) {
  std::vector<v1::AttendRequest> out = {HeaderMsg(h)};
  for (v1::AttendRequest& c : AllChunks(h)) out.push_back(std::move(c));
  return out;
}

std::vector<v1::AttendRequest> WithHeader(std::function<void(v1::AttendHeader&)> edit) {
  v1::AttendHeader h = GoodHeader();
  edit(h);
  return FullRequest(h);
}

// Only a header (edited from the good one): the server must refuse it before any chunk.
std::vector<v1::AttendRequest> HeaderOnly(std::function<void(v1::AttendHeader&)> edit) {
  v1::AttendHeader h = GoodHeader();
  edit(h);
  return {HeaderMsg(h)};
}

// The text-format request lines ("... [warning] attend id=... code=...") of a server log.
std::vector<std::string> AttendLines(const std::string& log) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "] attend ")) out.emplace_back(line);
  }
  return out;
}

// The key=value fields of a text request line, left to right (the first of a repeated key wins):
// a value is a bare token or double-quoted (returned without its quotes, escapes as written).
std::map<std::string, std::string> LineFields(const std::string& line) {
  std::map<std::string, std::string> out;
  size_t i = line.find("] attend ");
  if (i == std::string::npos) return out;
  i += 9;
  while (i < line.size()) {
    const size_t eq = line.find('=', i);
    if (eq == std::string::npos) break;
    const std::string key = line.substr(i, eq - i);
    std::string value;
    size_t j = eq + 1;
    if (j < line.size() && line[j] == '"') {
      for (++j; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) value += line[j++];
        value += line[j];
      }
      ++j;  // the closing quote
    } else {
      const size_t end = std::min(line.find(' ', j), line.size());
      value = line.substr(j, end - j);
      j = end;
    }
    out.emplace(key, value);
    i = j + 1;  // past the space
  }
  return out;
}

// Waits (up to 10 s) until the log holds more than `before` request lines and returns them all.
std::vector<std::string> WaitForAttendLines(ServerProcess& server, size_t before) {
  std::vector<std::string> lines;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    lines = AttendLines(server.process().Log(kWholeLog));
    if (lines.size() > before) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() < give_up);
  return lines;
}

// Sends `c.messages` on one Attend stream with the sync API, then WritesDone (unless cancelled),
// reads until the stream ends and returns the final status. Every step is bounded by the
// call's deadline.
RawOutcome SendRaw(v1::AttentionService::Stub* stub, const BadCase& c) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + c.deadline));
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendRequest, v1::AttendResponse>> stream =
      stub->Attend(&context);
  bool cancelled = false;
  for (size_t i = 0; i < c.messages.size(); ++i) {
    if (c.cancel_after >= 0 && static_cast<int>(i) == c.cancel_after) {
      // Give the server time to read what was sent (bounded, as the AppendContext cancel case
      // does), so the cancel lands mid-upload with the header parsed: a cancel that overtakes
      // the header is logged without the request id (seen once in a CI-like run).
      absl::SleepFor(absl::Milliseconds(200));
      context.TryCancel();
      cancelled = true;
      break;
    }
    if (!stream->Write(c.messages[i])) break;  // the server already ended the call
  }
  if (!cancelled) stream->WritesDone();
  RawOutcome out;
  v1::AttendResponse response;
  // A stream that ends in an error carries no responses; a response stream is at most a header
  // plus the output chunks, all bounded by the deadline.
  while (stream->Read(&response)) ++out.responses;
  out.status = stream->Finish();
  return out;
}

// An Attend call carrying raw message bytes, which the generated stub cannot send (truncated
// protobuf, a string field that is not UTF-8), then the half-close; the call's final status.
grpc::Status SendBytes(const std::shared_ptr<grpc::Channel>& channel,
                       const std::vector<std::string>& messages, absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::internal::RpcMethod method("/attnserve.v1.AttentionService/Attend",
                                         grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  for (const std::string& m : messages) {
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    if (!stream->Write(buffer)) break;
  }
  stream->WritesDone();
  grpc::ByteBuffer response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

// A serialized AttendRequest whose header.request_id holds `id` as is (proto3 strings must be
// UTF-8; this writes the bytes without checking): field 1 (header), field 1 (request_id).
std::string HeaderBytesWithId(const std::string& id) {
  EXPECT_LT(id.size(), 100u);
  std::string header = "\x0a";
  header += static_cast<char>(id.size());
  header += id;
  std::string request = "\x0a";
  request += static_cast<char>(header.size());
  return request + header;
}

// The value of attnserve_requests_total{code="CODE"} in Prometheus text (0 when absent).
double RequestsWithCode(const std::string& metrics, const std::string& code) {
  const std::string prefix = absl::StrCat("attnserve_requests_total{code=\"", code, "\"} ");
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (absl::StartsWith(line, prefix)) return std::stod(std::string(line.substr(prefix.size())));
  }
  return 0;
}

}  // namespace attnserve::testing
