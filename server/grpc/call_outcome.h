// What the client of a streaming call received when the call did not end with the server's own
// Finish: the Attend and AppendContext reactors log and count exactly that status (so the log
// line and the attnserve_requests_total label say what the client saw).
#ifndef ATTNSERVE_SERVER_GRPC_CALL_OUTCOME_H_
#define ATTNSERVE_SERVER_GRPC_CALL_OUTCOME_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/server_context.h"

namespace attnserve {

// Left in chunk.offset of a request message before each read (no client sends it: offsets below
// 0 are refused). Deserialising a message clears the whole message first, even when its bytes
// then fail to parse, so a failed read that leaves the marker in place received no message.
inline constexpr int64_t kUnreadMarker = std::numeric_limits<int64_t>::min();

// A gRPC deadline as an absl::Time (no deadline: InfiniteFuture).
inline absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Why gRPC ended a call under the server's feet.
struct CallEnd {
  // The server was stopping: the drain timeout had passed (or a second signal came) and
  // grpc::Server::Shutdown cancelled what was left.
  bool server_stopping = false;
  // A read failed although the client neither half-closed nor cancelled: gRPC refused a
  // message it received, which it only does for a message above the max receive size.
  bool oversized_message = false;
  // e.g. "receiving the request".
  std::string_view stage;
};

// The status the client got when gRPC itself ended the call (OnCancel, or a failed read): the
// server's Finish after that goes nowhere. In this order:
//  - server shutdown after the drain: grpc::Server::Shutdown cancels every call left, the client
//    sees UNAVAILABLE ("Cancelling all calls");
//  - a cancel within `slack` of the call's deadline: the client's deadline (its library cancels
//    the stream itself, slightly before the server's copy of the deadline expires);
//  - a message above the gRPC max receive size: gRPC answers RESOURCE_EXHAUSTED ("Received
//    message larger than max");
//  - otherwise the client cancelled: CANCELLED.
inline absl::Status EndedByGrpc(const grpc::CallbackServerContext& context, const CallEnd& end,
                                absl::Duration slack = absl::Milliseconds(100)) {
  const std::string stage(end.stage);
  if (end.server_stopping) {
    return absl::UnavailableError(
        absl::StrCat("server stopped (drain timeout passed) while ", stage));
  }
  if (absl::Now() + slack >= DeadlineOf(context)) {
    return absl::DeadlineExceededError(absl::StrCat("deadline exceeded while ", stage));
  }
  if (end.oversized_message) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a request message above the gRPC max receive size (--max-chunk-bytes + 1 MiB) while ",
        stage));
  }
  return absl::CancelledError(absl::StrCat("cancelled by the client while ", stage));
}

// The first string field of `m` (depth first, named like "header.request_id") that is not
// valid UTF-8, or "". Parsing stops at such a field with the bad bytes already stored, so after
// a failed parse this finds the field that failed it.
std::string FindInvalidUtf8(const google::protobuf::Message& m, const std::string& prefix = "");

// The status of a request message that arrived but could not be parsed (gRPC leaves the call
// open: the server's status is the client's): INVALID_ARGUMENT naming the string field that is
// not UTF-8 when there is one, else saying the bytes are not a valid `type_name`. `partial` is
// what the parser had filled in when it stopped.
absl::Status UnparseableMessage(const google::protobuf::Message& partial,
                                std::string_view type_name);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_GRPC_CALL_OUTCOME_H_
