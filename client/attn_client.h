// C++ client of attnserve: one Attend call streams Q, K, V up in chunks and assembles O (and LSE)
// from the streamed answer; Describe and Health wrap the unary calls.
//
// Thread-safety: an AttnClient may be shared by any number of threads; each call is independent
// (one gRPC channel, calls multiplexed over it).
#ifndef ATTNSERVE_CLIENT_ATTN_CLIENT_H_
#define ATTNSERVE_CLIENT_ATTN_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attnserve.grpc.pb.h"
#include "core/tensor/tensor.h"
#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/status.h"

namespace attnserve::client {

struct ClientOptions {
  // "host:port" (any gRPC target string).
  std::string target;
  // Null: an insecure channel (attnserve listens on trusted networks or behind a proxy).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Payload bytes per uploaded tensor chunk. Must be in [1, the server's max_chunk_bytes].
  int64_t chunk_bytes = int64_t{4} << 20;
  // Largest message the client accepts; -1: unlimited (the default). The server's default
  // response chunk (4 MiB - 64 KiB) fits gRPC's 4 MiB default, but a header's
  // response_chunk_bytes (or the server's --chunk-bytes) may ask for up to --max-chunk-bytes.
  int max_receive_message_bytes = -1;
  // Attempts per call, the first included (1: no retries). Only calls that failed with
  // UNAVAILABLE before any response arrived are retried (see Attend).
  int max_attempts = 4;
  // Backoff before retry r (r = 1, 2, ...): min(initial_backoff * multiplier^(r-1), max_backoff),
  // each scaled by a random factor in [0.8, 1.2] so that clients started together spread out.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double backoff_multiplier = 2.0;
};

// Bytes moved so far by one Attend call. The totals are known up front for the upload and from
// the response header for the download (0 until it arrives).
struct Progress {
  int64_t sent_bytes = 0;
  int64_t send_total_bytes = 0;
  int64_t received_bytes = 0;
  int64_t receive_total_bytes = 0;
  int attempt = 1;  // 1-based; the counts restart at 0 on a retry
};
// Called on gRPC's threads, never two at once for the same call; it must return quickly.
using ProgressCallback = std::function<void(const Progress&)>;

struct CallOptions {
  // Wall-clock limit of the whole call, retries and backoff included. absl::InfiniteDuration()
  // sets no deadline.
  absl::Duration timeout = absl::Minutes(5);
  // Wait for the channel to connect instead of failing at once while the server is unreachable
  // (still bounded by `timeout`).
  bool wait_for_ready = false;
  ProgressCallback progress;
};

// One request. The tensors are borrowed: they must stay alive and unchanged until Attend returns.
// q: [B, N, Hq, D], k and v: [B, N, Hkv, D], all three of one dtype.
struct AttendInput {
  const HostTensor* q = nullptr;
  const HostTensor* k = nullptr;
  const HostTensor* v = nullptr;
  attnserve::v1::AttentionSpec spec;
  bool return_lse = true;
  attnserve::v1::Placement placement = attnserve::v1::PLACEMENT_AUTO;
  std::string request_id;            // empty: the server makes one up
  int64_t response_chunk_bytes = 0;  // 0: the server's default
};

struct AttendResult {
  attnserve::v1::AttendResponseHeader header;  // timings, devices, sparsity, flops
  HostTensor o;                                // [B, N, Hq, D], the input dtype
  std::optional<HostTensor> lse;               // [B, Hq, N] f32, when return_lse
  int attempts = 1;                            // calls made, retries included
  // Client-side wall clock of the successful attempt, in seconds.
  double upload_seconds = 0;  // start of the call to the last input byte handed to gRPC
  double total_seconds = 0;   // start of the call to the last output byte
};

// grpc.health.v1 HealthCheckResponse.ServingStatus, numbered as on the wire.
enum class ServingStatus : int { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
// "UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN".
std::string_view ServingStatusName(ServingStatus status);

class AttnClient {
 public:
  // INVALID_ARGUMENT for bad options. Creating the channel does not connect: an unreachable
  // server shows up as UNAVAILABLE on the first call.
  static absl::StatusOr<std::unique_ptr<AttnClient>> Create(ClientOptions options);
  ~AttnClient();
  AttnClient(const AttnClient&) = delete;
  AttnClient& operator=(const AttnClient&) = delete;

  // Runs one attention request. Uploads Q, K, V in options.chunk_bytes chunks with one write in
  // flight while reading responses concurrently, so a server error in the middle of the upload
  // ends the call at once. The response's O/LSE chunks are checked: the header comes first, every
  // byte of each tensor arrives exactly once, sizes match the header's shapes and dtype.
  //
  // Retries: a call that ends UNAVAILABLE before any response message arrived (the server was
  // unreachable, or refused the stream while draining) is re-sent, up to max_attempts with
  // backoff, within the call's timeout. Attention has no side effects, so a re-send cannot apply
  // anything twice; after partial results, or on any other code, the error is returned as is.
  absl::StatusOr<AttendResult> Attend(const AttendInput& input, const CallOptions& options = {});

  // Describe, retried like Attend on UNAVAILABLE.
  absl::StatusOr<attnserve::v1::DescribeResponse> Describe(const CallOptions& options = {});

  // grpc.health.v1.Health/Check for `service` ("" is the whole server): the serving status the
  // server reported, or the call's error. Not retried: callers poll it.
  absl::StatusOr<ServingStatus> HealthCheck(const CallOptions& options = {},
                                            const std::string& service = "");
  // HealthCheck folded into one status: OK when SERVING, UNAVAILABLE naming the reported status
  // otherwise, the call's error when the call fails.
  absl::Status Health(const CallOptions& options = {}, const std::string& service = "");

  const ClientOptions& options() const { return options_; }

 private:
  AttnClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Waits out the backoff before retry `retry` (1-based), never past `deadline`. False when the
  // deadline leaves no time for another attempt.
  bool SleepBeforeRetry(int retry, absl::Time deadline);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<attnserve::v1::AttentionService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_stub_;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_ATTN_CLIENT_H_
