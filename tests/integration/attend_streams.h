// Attend streams for the integration tests that send malformed or hostile requests
// (bad_request_test, request_log_test): the good request they start from, raw sends with the
// generated stub or as raw bytes, and readers of the server's text request lines and metrics.
#ifndef ATTNSERVE_TESTS_INTEGRATION_ATTEND_STREAMS_H_
#define ATTNSERVE_TESTS_INTEGRATION_ATTEND_STREAMS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"
#include "tests/integration/server_fixture.h"

namespace attnserve::testing {

namespace v1 = ::attnserve::v1;

// The server of this suite accepts chunks up to this size, so that one case can exceed it cheaply.
constexpr int64_t kMaxChunkBytes = int64_t{1} << 20;
// The good request every case starts from: f32 [1, 128, 2, 32], kv_heads 1, dense.
constexpr int64_t kTokens = 128;
constexpr int64_t kQHeads = 2;
constexpr int64_t kKvHeads = 1;
constexpr int64_t kHeadDim = 32;
constexpr int64_t kQBytes = kTokens * kQHeads * kHeadDim * 4;
constexpr int64_t kKvBytes = kTokens * kKvHeads * kHeadDim * 4;

// The good request: f32 [1, kTokens, kQHeads, kHeadDim], kv_heads kKvHeads, dense, return_lse,
// request_id "bad-request-test".
v1::AttendHeader GoodHeader();
v1::AttendRequest HeaderMsg(const v1::AttendHeader& h);
// `size` bytes of well-formed f32 values (so the data itself is never the problem).
std::string Payload(int64_t size, uint64_t seed);
v1::AttendRequest ChunkMsg(v1::TensorKind kind, int64_t offset, int64_t size);
// Every byte of Q, K and V for `h` (sizes from its dims, f32), in chunks of `chunk` bytes.
std::vector<v1::AttendRequest> AllChunks(const v1::AttendHeader& h, int64_t chunk = 8192);
// A header plus all chunks of it.
std::vector<v1::AttendRequest> FullRequest(const v1::AttendHeader& h);
// The good request with its header edited.
std::vector<v1::AttendRequest> WithHeader(std::function<void(v1::AttendHeader&)> edit);
// Only a header (edited from the good one): the server must refuse it before any chunk.
std::vector<v1::AttendRequest> HeaderOnly(std::function<void(v1::AttendHeader&)> edit);

struct BadCase {
  std::string name;
  std::vector<v1::AttendRequest> messages;
  grpc::StatusCode code;
  // Substring the error message must contain: the field it names. Empty for the codes gRPC
  // produces on the client side (deadline, cancel), whose messages are gRPC's own.
  std::string field;
  absl::Duration deadline = absl::Seconds(30);
  // Cancel the call (ClientContext::TryCancel) after this many messages.
  int cancel_after = -1;
  // Whether response messages may precede the error: a stray chunk after a complete upload can
  // reach the server after the job has run and its response has started.
  bool may_respond = false;
};

struct RawOutcome {
  grpc::Status status;
  int responses = 0;
};

// Sends `c.messages` on one Attend stream with the sync API, then WritesDone (unless cancelled),
// reads until the stream ends and returns the final status. Every step is bounded by the
// call's deadline.
RawOutcome SendRaw(v1::AttentionService::Stub* stub, const BadCase& c);

// An Attend call carrying raw message bytes, which the generated stub cannot send (truncated
// protobuf, a string field that is not UTF-8), then the half-close; the call's final status.
grpc::Status SendBytes(const std::shared_ptr<grpc::Channel>& channel,
                       const std::vector<std::string>& messages, absl::Duration timeout);

// A serialized AttendRequest whose header.request_id holds `id` (< 100 bytes) as is, UTF-8 or
// not.
std::string HeaderBytesWithId(const std::string& id);

// The whole server log (ChildProcess::Log reads a tail; this tail is everything these tests make).
inline constexpr size_t kWholeLog = size_t{64} << 20;

// The text-format request lines ("... [warning] attend id=... code=...") of a server log.
std::vector<std::string> AttendLines(const std::string& log);

// The key=value fields of a text request line, left to right (the first of a repeated key wins):
// a value is a bare token or double-quoted (returned without its quotes, escapes as written).
std::map<std::string, std::string> LineFields(const std::string& line);

// Waits (up to 10 s) until the log holds more than `before` request lines and returns them all.
std::vector<std::string> WaitForAttendLines(ServerProcess& server, size_t before);

// The value of attnserve_requests_total{code="CODE"} in Prometheus text (0 when absent).
double RequestsWithCode(const std::string& metrics, const std::string& code);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_INTEGRATION_ATTEND_STREAMS_H_
