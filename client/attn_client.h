// C++ client of attnserve: one Attend call streams Q, K, V up in chunks and assembles O (and LSE)
// from the streamed answer; Describe and Health wrap the unary calls.
//
// Thread-safety: an AttnClient may be shared by any number of threads; each call is independent
// (one gRPC channel, calls multiplexed over it).
#ifndef ATTNSERVE_CLIENT_ATTN_CLIENT_H_
#define ATTNSERVE_CLIENT_ATTN_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
  // Null: an insecure channel (attnserve listens on trusted networks or behind a proxy). TLS:
  // TlsCredentialsFromFiles (client/client_security.h) or any grpc::ChannelCredentials.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "authorization: Bearer <token>" on every call when not empty (a server with
  // --token-file needs it). TokenFromFileOrEnv reads --token-file or ATTNSERVE_TOKEN.
  std::string token;
  // TLS: the name the server's certificate must carry, when it is not the target's host (an IP
  // target, a test certificate). Empty: the target's host.
  std::string tls_server_name;
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
  // TCP connections the client spreads its Attend calls over (round robin; each connection is
  // made on first use). One HTTP/2 connection carries about one stream's worth of bytes per
  // second however many calls share it, so concurrent large calls need several. In [1, 64].
  int connections = 8;
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

// Bytes [offset, offset + bytes) of a region registered with RegisterSystemRegion or
// RegisterCudaIpcRegion (AttendHeader's RegionRef). offset must be a multiple of 64 and bytes the
// tensor's exact size.
struct TensorRegion {
  std::string region;
  int64_t offset = 0;
  int64_t bytes = 0;
};

// One request. The tensors are borrowed: they must stay alive and unchanged until Attend returns.
// q: [B, N, Hq, D], k and v: [B, N, Hkv, D], all three of one dtype.
//
// Shared memory (callers on the server's host): a tensor may come from a region instead
// (q_region etc.; then its pointer stays null and nothing of it is streamed). When q is not given,
// `shape` and `dtype` describe the request. With o_region set, the server writes O (and LSE into
// lse_region, required when return_lse) into the regions and the result's o/lse stay empty
// (result.header.outputs_in_regions() is true).
struct AttendInput {
  const HostTensor* q = nullptr;
  const HostTensor* k = nullptr;
  const HostTensor* v = nullptr;
  std::optional<TensorRegion> q_region, k_region, v_region, o_region, lse_region;
  std::optional<AttentionShape> shape;  // required when q is null
  DType dtype = DType::kF32;            // used when q is null
  attnserve::v1::AttentionSpec spec;
  bool return_lse = true;
  attnserve::v1::Placement placement = attnserve::v1::PLACEMENT_AUTO;
  // Empty: the server makes one up. At most 128 bytes of printable ASCII (the server refuses
  // others with INVALID_ARGUMENT naming header.request_id).
  std::string request_id;
  int64_t response_chunk_bytes = 0;  // 0: the server's default
  // Inference shapes (docs/DESIGN.md "The math"): k and v may have another token count than q
  // (their dims say it; shape->kv_tokens when they come from regions); query row i sits at
  // q_offset + i (unset: 0, or the context's last rows); packed sequences by cu_seqlens.
  std::optional<int64_t> q_offset;
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_k;
  // A context the server keeps (CreateContext/AppendContext): K and V are its rows, so k, v and
  // their regions stay unset; batch 1, and its dtype, kv_heads and head_dim (give `shape` for
  // kv_heads, since there is no k to read them from).
  std::string context;
};

struct AttendResult {
  attnserve::v1::AttendResponseHeader header;  // timings, devices, sparsity, flops
  HostTensor o;                   // [B, N, Hq, D], the input dtype (empty: outputs_in_regions)
  std::optional<HostTensor> lse;  // [B, Hq, N] f32, when return_lse and not in a region
  int attempts = 1;               // calls made, retries included
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

  // Shared-memory regions (attn_client_regions.cc), not retried. A POSIX shm object of
  // this host (`shm_key`, e.g. "/attn_in_1234"; SharedMemoryRegion makes one), bytes
  // [offset, offset + bytes) of it, or the raw cudaIpcMemHandle_t of a device allocation.
  absl::StatusOr<attnserve::v1::RegionStatus> RegisterSystemRegion(const std::string& name,
                                                                   const std::string& shm_key,
                                                                   int64_t offset, int64_t bytes,
                                                                   const CallOptions& options = {});
  absl::StatusOr<attnserve::v1::RegionStatus> RegisterCudaIpcRegion(
      const std::string& name, const std::string& ipc_handle, int device, int64_t bytes,
      const CallOptions& options = {});
  // The response says whether requests in flight still use the region.
  absl::StatusOr<attnserve::v1::UnregisterRegionResponse> UnregisterRegion(
      const std::string& name, const CallOptions& options = {});
  absl::StatusOr<attnserve::v1::ListRegionsResponse> ListRegions(const CallOptions& options = {});

  // Contexts (attn_client_regions.cc), not retried (an append re-sent could add rows twice).
  // ttl: 0 is the server's default. AppendContext streams k and v ([T, Hkv, D] or [1, T, Hkv, D],
  // the context's dtype) in options().chunk_bytes chunks, calling options.progress (on the
  // caller's thread) after each; with expect_tokens the server refuses (FAILED_PRECONDITION)
  // unless the context holds exactly that many rows when it commits.
  // shards: devices to split the rows over by sequence (CreateContextRequest.shards; 0: the
  // server decides, 1: one device).
  absl::StatusOr<attnserve::v1::ContextStatus> CreateContext(
      const std::string& name, DType dtype, int64_t kv_heads, int64_t head_dim,
      int64_t capacity_tokens = 0, absl::Duration ttl = absl::ZeroDuration(),
      const CallOptions& options = {}, int32_t shards = 0);
  absl::StatusOr<attnserve::v1::ContextStatus> AppendContext(
      const std::string& name, const HostTensor& k, const HostTensor& v,
      std::optional<int64_t> expect_tokens = std::nullopt, const CallOptions& options = {});
  // The same rows read by the server from registered regions (callers on the server's host):
  // `tokens` rows of K and of V, each region slice exactly tokens x kv_heads x head_dim elements
  // of the context's dtype. The server copies them into the context before it answers, so the
  // regions may be rewritten or unregistered once this returns.
  absl::StatusOr<attnserve::v1::ContextStatus> AppendContextFromRegions(
      const std::string& name, int64_t tokens, const TensorRegion& k, const TensorRegion& v,
      std::optional<int64_t> expect_tokens = std::nullopt, const CallOptions& options = {});
  absl::StatusOr<attnserve::v1::ContextStatus> GetContext(const std::string& name,
                                                          const CallOptions& options = {});
  absl::StatusOr<attnserve::v1::DeleteContextResponse> DeleteContext(
      const std::string& name, const CallOptions& options = {});
  absl::StatusOr<attnserve::v1::ListContextsResponse> ListContexts(const CallOptions& options = {});

  const ClientOptions& options() const { return options_; }

 private:
  AttnClient(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // One unary region call with the call options' deadline.
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Unary(Method method, const Request& request, const CallOptions& options);

  // Waits out the backoff before retry `retry` (1-based), never past `deadline`. False when the
  // deadline leaves no time for another attempt.
  bool SleepBeforeRetry(int retry, absl::Time deadline);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<attnserve::v1::AttentionService::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_stub_;
  // Attend's stubs, one per connection (the first is stub_'s channel); next_stub_ picks.
  std::vector<std::unique_ptr<attnserve::v1::AttentionService::Stub>> attend_stubs_;
  std::atomic<uint64_t> next_stub_{0};
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_ATTN_CLIENT_H_
